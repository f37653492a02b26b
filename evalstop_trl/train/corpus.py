"""Training one run of the real-run corpus (``evalstop_trl.analysis.corpus`` has the design and rules).

Each task gives the trainer its proxy (a reward function, or proxy-labelled preference pairs for
DPO), the platform its cheap world-feedback eval (per-example scores of completions sampled on a
prompt set of its own), and the labeller its trusted gold eval (many other prompts, deterministic).
The recorder logs, at every eval: the world feedback (mean, per-example scores, n, paired noise),
the gold (mean and standard error), the trainer's train loss, the proxy's mean on the eval's
completions, the KL to the initial policy on those completions, and their mean length.

Imports torch and trl: keep this module out of the coordinator's import path.
"""

from __future__ import annotations

import copy
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..analysis.corpus import SAMPLES, CorpusConfig, Task, Trainer
from . import judge as jd
from .tiny import GoldEval, Preset, build_model, build_tokenizer, gold_score, make_prompts, save_tiny

__all__ = ["TaskSetup", "setup_task", "train_run"]

GOLD_PROMPTS = 256
COMPLETION_LEN = 8
Scorer = Callable[[list[str], list[str]], list[float]]  # (prompts, completions) -> scores


@dataclass
class TaskSetup:
    """What one run of a task needs: the proxy, its scorers and the prompt pools (pairwise disjoint)."""

    proxy: Callable[..., list[float]]  # the trainer's reward function (TRL's reward_funcs signature)
    proxy_score: Scorer
    feedback_score: Scorer  # the world-feedback judge of one completion
    gold: Callable[[Any, Any], list[float]]  # (model, tokenizer) -> per-example gold scores
    train_prompts: list[str]
    feedback_prompts: list[str]
    hidden: int
    layers: int


def _disjoint(n: int, seed: int, taken: set[str]) -> list[str]:
    out = [p for p in dict.fromkeys(make_prompts(4 * n + 64, seed)) if p not in taken][:n]
    if len(out) < n:
        raise ValueError(f"could not draw {n} fresh prompts from seed {seed}")
    taken.update(out)
    return out


def _letter(cfg: CorpusConfig, run_seed: int) -> TaskSetup:
    preset = Preset("corpus", w_target=1.0, w_spurious=2.0 * cfg.hackability, lr=cfg.lr)
    gold_eval = GoldEval(preset, n_prompts=GOLD_PROMPTS, seed=4242, per_example=True)
    taken = set(gold_eval.prompts)
    feedback = _disjoint(cfg.eval_n // SAMPLES, 777, taken)
    train = _disjoint(512, 31337 + run_seed, taken)
    w = preset.w_spurious
    proxy = _scorer(lambda p, c: (c.count("e") + w * c.count("z")) / max(len(c), 1))
    return TaskSetup(_as_reward(proxy), proxy, _scorer(lambda p, c: gold_score(c, preset)),
                     lambda model, tok: gold_eval(model, tok), train, feedback, 64, 2)


def _rule_gold(prompts: list[str]) -> Callable[[Any, Any], list[float]]:
    def gold(model, tok) -> list[float]:
        ps, cs = jd._sample(model, tok, tuple(prompts), jd.GOLD_SAMPLES, jd.GOLD_SEED)
        return [jd.alternation(p, c) for p, c in zip(ps, cs, strict=True)]

    return gold


def _scorer(fn: Callable[[str, str], float]) -> Scorer:
    return lambda ps, cs: [fn(jd.letters_of(p), jd.letters_of(c)) for p, c in zip(ps, cs, strict=True)]


def _as_reward(score: Scorer) -> Callable[..., list[float]]:
    def reward(prompts=None, completions=None, **kw) -> list[float]:
        if prompts is None or completions is None or len(prompts) != len(completions):
            raise ValueError("the proxy needs prompts and completions of the same length")
        return score([jd.letters_of(p) for p in prompts], [jd.letters_of(c) for c in completions])

    reward.__name__ = "proxy"
    return reward


def _judge_pools(cfg: CorpusConfig, run_seed: int) -> tuple[jd.PromptSets, list[str], list[str]]:
    sets = jd.prompt_sets()
    taken = set(sets.gold) | set(sets.judge) | set(sets.train) | set(sets.feedback)
    feedback = _disjoint(cfg.eval_n // SAMPLES, 9101, taken)
    return sets, feedback, list(sets.train)


def _judge(cfg: CorpusConfig, run_seed: int) -> TaskSetup:
    sets, feedback, train = _judge_pools(cfg, run_seed)
    judge = _JUDGES.get("judge") or _JUDGES.setdefault("judge", jd.train_judge(sets.judge))
    w = 2.0 * cfg.hackability
    proxy = _scorer(lambda p, c: jd.alternation(p, c) + w * jd.vowel_share(c))
    return TaskSetup(_as_reward(proxy), proxy, judge, _rule_gold(list(sets.gold)), train, feedback,
                     jd.HIDDEN, jd.LAYERS)


def _gao(cfg: CorpusConfig, run_seed: int) -> TaskSetup:
    """Gao et al.'s synthetic setting: the proxy is a reward *model* trained on gold labels (fewer and
    noisier as hackability grows); world feedback a larger judge whose data includes the proxy's."""
    sets, feedback, train = _judge_pools(cfg, run_seed)
    h = cfg.hackability
    n_proxy = int(1500 - 1400 * h)
    key = f"gao-{cfg.config_id}"
    if key not in _JUDGES:
        proxy_rm = None if h == 0 else jd.train_judge(sets.judge[:n_proxy], seed=7000 + cfg.config_id,
                                                      noise=0.15 + 0.25 * h)
        wf = jd.train_judge(sets.judge[:n_proxy + 500], seed=7000 + cfg.config_id, noise=0.15)
        _JUDGES[key] = (proxy_rm, wf)
    proxy_rm, wf = _JUDGES[key]
    proxy: Scorer = _scorer(jd.alternation) if proxy_rm is None else proxy_rm
    return TaskSetup(_as_reward(proxy), proxy, wf, _rule_gold(list(sets.gold)), train, feedback, jd.HIDDEN, jd.LAYERS)


_JUDGES: dict[str, Any] = {}  # learned judges are deterministic per key: built once per process
_TASKS: dict[Task, Callable[[CorpusConfig, int], TaskSetup]] = {Task.LETTER: _letter, Task.JUDGE: _judge, Task.GAO: _gao}


def setup_task(cfg: CorpusConfig, run_seed: int) -> TaskSetup:
    return _TASKS[cfg.task](cfg, run_seed)


def preference_pairs(task: TaskSetup, seed: int) -> dict[str, list[str]]:
    """Offline pairs for DPO, labelled by the proxy: two random completions per prompt, the one the
    proxy scores higher is chosen (ties: a third draw)."""
    rng = random.Random(seed)
    prompts, chosen, rejected = [], [], []
    for p in task.train_prompts:
        a, b = jd._markov_string(rng), jd._markov_string(rng)
        sa, sb = task.proxy_score([p, p], [a, b])
        if sa == sb:
            continue
        prompts.append(p)
        chosen.append(a if sa > sb else b)
        rejected.append(b if sa > sb else a)
    return {"prompt": prompts, "chosen": chosen, "rejected": rejected}


# ----------------------------------------------------------------------------- the recorder
@torch.no_grad()
def _kl(model, ref, seqs: torch.Tensor, prompt_len: int, pad_id: int) -> float:
    """Mean over sampled completions of sum_t log pi(y_t) - log pi_ref(y_t): a Monte-Carlo KL(pi || ref)."""
    mask = (seqs[:, prompt_len:] != pad_id).float()
    attn = (seqs != pad_id).long()
    lp = []
    for m in (model, ref):
        # the head applied by hand: under TRL's trainers ``m(...).logits`` of the training model came back
        # equal to the reference's (measured: hidden states differ, logits identical), so it is not trusted
        hidden = m.model(input_ids=seqs, attention_mask=attn).last_hidden_state
        logits = m.lm_head(hidden)[:, prompt_len - 1:-1].float()
        lp.append(torch.log_softmax(logits, -1).gather(-1, seqs[:, prompt_len:, None]).squeeze(-1))
    total = ((lp[0] - lp[1]) * mask).sum(dim=1).mean()
    return float(total)


class Recorder:
    """Runs the evals every ``eval_every`` steps and keeps one line per eval (``lines``)."""

    def __init__(self, cfg: CorpusConfig, task: TaskSetup, run_seed: int) -> None:
        self.cfg, self.task, self.lines = cfg, task, []
        self.seed = 100_000 + 1000 * cfg.config_id + 10 * run_seed
        self.calls, self.prev, self.ref, self.pending = 0, None, None, None

    def evaluate(self, step: int, model, tok) -> dict[str, Any]:
        from ..core.examples import summarize
        from .evaluation import evaluate_preserving_state

        def run(_model, _tok):
            self.calls += 1
            seed = self.seed if self.cfg.fixed_seed_eval else self.seed + self.calls
            torch.manual_seed(seed)
            dev = next(model.parameters()).device
            enc = tok(self.task.feedback_prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(dev)
            out = model.generate(**enc, max_new_tokens=COMPLETION_LEN, do_sample=True, temperature=1.0, top_k=0,
                                 top_p=1.0, num_return_sequences=SAMPLES, pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id)
            plen = enc["input_ids"].shape[1]
            texts = [jd.letters_of(t) for t in tok.batch_decode(out[:, plen:], skip_special_tokens=True)]
            prompts = [p for p in self.task.feedback_prompts for _ in range(SAMPLES)]
            scores = self.task.feedback_score(prompts, texts)
            kl = _kl(model, self.ref, out, plen, tok.pad_token_id)
            gold = self.task.gold(model, tok)
            return scores, texts, prompts, kl, gold

        scores, texts, prompts, kl, gold = evaluate_preserving_state(run, model, tok, check=False)
        ev = summarize(scores, self.prev)
        self.prev = ev
        gsd = statistics.pstdev(gold) if len(gold) > 1 else 0.0
        return {"step": step, "world_feedback": ev.mean, "eval_n": ev.n, "eval_noise": ev.noise,
                "gold": sum(gold) / len(gold), "gold_se": gsd / math.sqrt(len(gold)),
                "proxy_reward": sum(self.task.proxy_score(prompts, texts)) / len(texts), "kl": kl,
                "length": sum(map(len, texts)) / len(texts), "examples": [round(s, 4) for s in scores]}

    def callback(self):
        from transformers import TrainerCallback

        from .session import LOSS_KEYS

        rec = self

        class _Cb(TrainerCallback):
            def on_train_begin(self, args, state, control, model=None, **kw):
                rec.ref = copy.deepcopy(model).eval()

            def on_step_end(self, args, state, control, model=None, processing_class=None, **kw):
                if state.global_step % rec.cfg.eval_every or len(rec.lines) >= rec.cfg.evals:
                    return
                tok = processing_class if processing_class is not None else kw.get("tokenizer")
                rec.pending = rec.evaluate(state.global_step, model, tok)
                control.should_log = True

            def on_log(self, args, state, control, logs=None, **kw):
                if rec.pending is None or rec.pending["step"] != state.global_step:
                    return
                logs = logs or {}
                rec.pending["train_loss"] = next((float(logs[k]) for k in LOSS_KEYS if k in logs), None)
                rec.lines.append(rec.pending)
                rec.pending = None

        return _Cb()


# ----------------------------------------------------------------------------- one run
def train_run(cfg: CorpusConfig, run_seed: int, workdir: str | Path, device: str = "cpu") -> tuple[list[dict], float]:
    """Train one run of the corpus to its end (no detector); (eval lines, seconds)."""
    from datasets import Dataset
    from transformers.trainer_callback import PrinterCallback

    from .tiny import _common_args

    task = setup_task(cfg, run_seed)
    out = Path(workdir)
    tok = build_tokenizer()
    hidden, layers = (256, 4) if device == "cuda" else (task.hidden, task.layers)
    model = build_model(tok, hidden=hidden, layers=layers, heads=4, seed=run_seed * 1000 + cfg.config_id)
    save_tiny(model, tok, out / "base-model")
    rec = Recorder(cfg, task, run_seed)
    preset = Preset("corpus", lr=cfg.lr)
    batch = 32 if device == "cuda" else 16
    common = dict(seed=run_seed, device=device)
    if cfg.trainer in (Trainer.GRPO, Trainer.RLOO):
        from trl import GRPOConfig, GRPOTrainer, RLOOConfig, RLOOTrainer

        cfg_cls, tr_cls = (GRPOConfig, GRPOTrainer) if cfg.trainer is Trainer.GRPO else (RLOOConfig, RLOOTrainer)
        args = _common_args(cfg_cls, out / "trainer", preset, cfg.max_steps, per_device_train_batch_size=batch,
                            num_generations=8, max_completion_length=COMPLETION_LEN, beta=cfg.beta,
                            temperature=1.0, **common)
        tr = tr_cls(model=model, reward_funcs=task.proxy, args=args, processing_class=tok,
                    train_dataset=Dataset.from_dict({"prompt": task.train_prompts}), callbacks=[rec.callback()])
    elif cfg.trainer is Trainer.ONLINE_DPO:
        from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

        args = _common_args(OnlineDPOConfig, out / "trainer", preset, cfg.max_steps, per_device_train_batch_size=batch,
                            max_new_tokens=COMPLETION_LEN, temperature=1.0, beta=cfg.beta, **common)
        tr = OnlineDPOTrainer(model=model, reward_funcs=task.proxy, args=args, processing_class=tok,
                              train_dataset=Dataset.from_dict({"prompt": task.train_prompts}),
                              callbacks=[rec.callback()])
    else:
        from trl import DPOConfig, DPOTrainer

        args = _common_args(DPOConfig, out / "trainer", preset, cfg.max_steps, per_device_train_batch_size=batch,
                            beta=cfg.beta, max_length=16, **common)
        tr = DPOTrainer(model=model, args=args, processing_class=tok, callbacks=[rec.callback()],
                        train_dataset=Dataset.from_dict(preference_pairs(task, 5000 + run_seed)))
    tr.remove_callback(PrinterCallback)
    t0 = time.time()
    tr.train()
    return rec.lines, time.time() - t0


assert set(_TASKS) == set(Task), "every task of the design has a trainer here"
