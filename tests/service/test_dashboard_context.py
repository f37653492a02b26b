"""A run's context (issue 19): the callback records its tags and the trainer's whitelisted
hyperparameters with the job's registration, a real (tiny) transformers Trainer run included."""

from __future__ import annotations

import math
from enum import Enum
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

from evalstop_trl import Coordinator, MemoryStore  # noqa: E402
from evalstop_trl.train.callback import EvalStopCallback  # noqa: E402
from evalstop_trl.train.hparams import trainer_hparams  # noqa: E402


def _trainer(out, cb, **args):
    from datasets import Dataset
    from transformers import DataCollatorForLanguageModeling, Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback

    from evalstop_trl.train.tiny import build_model, build_tokenizer, make_prompts

    tok = build_tokenizer()
    ds = Dataset.from_dict(dict(tok([p + "eeee" for p in make_prompts(32, 1)], add_special_tokens=False)))
    targs = TrainingArguments(output_dir=str(out), report_to="none", use_cpu=True, save_strategy="no",
                              disable_tqdm=True, hub_token="hf_secret_do_not_send", **args)
    trainer = Trainer(model=build_model(tok), args=targs, train_dataset=ds, processing_class=tok, callbacks=[cb],
                      data_collator=DataCollatorForLanguageModeling(tok, mlm=False))
    trainer.remove_callback(PrinterCallback)
    return trainer


def test_a_real_trainer_registers_its_tags_and_hyperparameters(tmp_path):
    coordinator = Coordinator(MemoryStore())
    cb = EvalStopCallback(lambda model, tok: 0.5, eval_every=2, coordinator=coordinator, job_id="ctx-run",
                          tags={"team": "rl", "sweep": 3}, save_best=False)
    _trainer(tmp_path, cb, max_steps=4, learning_rate=3e-4, per_device_train_batch_size=8, seed=7).train()
    view = coordinator.status("local", "ctx-run")
    assert dict(view.tags) == {"sweep": "3", "team": "rl"}
    h = dict(view.hparams)
    assert h["learning_rate"] == 3e-4 and h["per_device_train_batch_size"] == 8 and h["max_steps"] == 4
    assert h["seed"] == 7 and h["lr_scheduler_type"] == "linear" and h["model_name"]
    assert not any("token" in k or "dir" in k for k in h)  # only the whitelist leaves the process
    assert "hf_secret" not in repr(h)


def test_bad_tags_are_refused_when_the_callback_is_made():
    with pytest.raises(ValueError, match="tags keys must be 1-64 characters"):
        EvalStopCallback(lambda m, t: 0.5, eval_every=2, tags={"k" * 65: "v"})
    with pytest.raises(ValueError, match="at most 32 entries"):
        EvalStopCallback(lambda m, t: 0.5, eval_every=2, tags={f"t{i}": "v" for i in range(33)})


def test_trainer_hparams_keeps_scalars_of_the_whitelist_only():
    class Sched(str, Enum):
        COSINE = "cosine"

    args = SimpleNamespace(learning_rate=1e-5, beta=0.1, lr_scheduler_type=Sched.COSINE, temperature=math.nan,
                           max_length=[1, 2], optim="x" * 1000, output_dir="/secret/path", hub_token="hf_x",
                           num_generations=8, bf16=True)
    model = SimpleNamespace(config=SimpleNamespace(_name_or_path="Qwen/Qwen2-0.5B"))
    assert trainer_hparams(args, model) == {"beta": 0.1, "bf16": True, "learning_rate": 1e-5,
                                            "lr_scheduler_type": "cosine", "model_name": "Qwen/Qwen2-0.5B",
                                            "num_generations": 8, "optim": "x" * 256}
