"""Your own model: EvalStop on a GRPO run you build yourself, nothing from evalstop but the callback.

A 2-layer GPT-2 over a 30-token character tokenizer (both built here, no download), a reward model
you can hack (it pays for the letter "e", which is what you want, and more for "z", which is not),
and a held-out world-feedback eval (the share of "e" the policy writes on prompts it never trains
on). GRPO first learns both letters, then trades "e" for "z": the reward keeps rising while the eval
peaks and falls, and ``EvalStopCallback`` stops the run and keeps its best checkpoint. Under a minute
on a CPU; exits 0 when the run was stopped before its planned end.

    python configs/examples/own_model.py [--out DIR] [--max-steps 200]
"""

from __future__ import annotations

import argparse
import random
import string
import tempfile
import warnings
from pathlib import Path

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from evalstop_trl import EvalStopCallback

LETTERS = string.ascii_lowercase


def my_tokenizer() -> PreTrainedTokenizerFast:
    vocab = {t: i for i, t in enumerate(["<pad>", "<bos>", "<eos>", "<unk>", *LETTERS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", bos_token="<bos>", eos_token="<eos>",
                                   unk_token="<unk>")
    fast.padding_side = "left"
    return fast


def my_model(tokenizer: PreTrainedTokenizerFast, out: Path) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=64, n_layer=2, n_head=4, n_positions=64,
                                       pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
                                       eos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(out)  # a trainer that builds a reference model reloads it from config._name_or_path
    tokenizer.save_pretrained(out)
    model.config._name_or_path = str(out)
    return model


def prompts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(LETTERS[:20]) for _ in range(4)) for _ in range(n)]


def hackable_reward(completions: list[str], **_: object) -> list[float]:
    """The reward model: pays for "e" (wanted) and more for "z" (a flaw to exploit)."""
    return [(c.count("e") + 1.6 * c.count("z")) / max(len(c), 1) for c in completions]


class HeldOutEval:
    """World feedback: the expected share of "e" in greedy completions of held-out prompts."""

    def __init__(self) -> None:
        self.prompts = prompts(32, seed=12345)

    @torch.no_grad()
    def __call__(self, model, tokenizer) -> float:
        enc = tokenizer(self.prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        enc = enc.to(next(model.parameters()).device)
        out = model.generate(**enc, max_new_tokens=8, do_sample=False, output_scores=True,
                             return_dict_in_generate=True, pad_token_id=tokenizer.pad_token_id)
        e = tokenizer.convert_tokens_to_ids("e")
        return float(torch.stack([torch.softmax(s.float(), -1)[:, e] for s in out.scores], 1).mean())


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", help="output folder (default: a new temporary one)")
    p.add_argument("--max-steps", type=int, default=200, help="the planned length of the run")
    a = p.parse_args()
    warnings.filterwarnings("ignore", category=FutureWarning)
    out = Path(a.out or tempfile.mkdtemp(prefix="evalstop-own-model-"))
    tokenizer = my_tokenizer()
    model = my_model(tokenizer, out / "base-model")
    stopper = EvalStopCallback(HeldOutEval(), eval_every=10)  # the default detector, embedded SQLite in out/run
    args = GRPOConfig(output_dir=str(out / "run"), max_steps=a.max_steps, learning_rate=1e-3,
                      lr_scheduler_type="constant", per_device_train_batch_size=16, num_generations=8,
                      max_completion_length=8, beta=0.0, temperature=1.0, logging_steps=10, save_strategy="no",
                      report_to="none", use_cpu=True, bf16=False, disable_tqdm=True, seed=0)
    trainer = GRPOTrainer(model=model, reward_funcs=hackable_reward, args=args, processing_class=tokenizer,
                          train_dataset=Dataset.from_dict({"prompt": prompts(512, seed=1)}), callbacks=[stopper])
    trainer.train()
    stopped = stopper.stopped_at is not None
    print(f"{'stopped' if stopped else 'not stopped'} at step {trainer.state.global_step} of {a.max_steps}: "
          f"{stopper.decision.reason if stopper.decision else 'no decision'}")
    print(f"best: step {stopper.best_step}, eval {stopper.best_score:.4f}, kept in {stopper.best_checkpoint}")
    return 0 if stopped and trainer.state.global_step < a.max_steps else 1


if __name__ == "__main__":
    raise SystemExit(main())
