"""Run by test_callback.py under torch.distributed.run with 2 CPU processes (gloo).

``dist_worker.py OUT``: rank 0 evaluates; ``dist_worker.py OUT all``: every rank evaluates, with a
collective in the eval (as a sharded model's forward is), and rank 0's score must win."""

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from evalstop_trl.train.tiny import PRESETS, GoldEval, run_tiny

out = Path(sys.argv[1])
all_ranks = len(sys.argv) > 2 and sys.argv[2] == "all"
gold = GoldEval(PRESETS["hacked"])


def collective_eval(model, tokenizer):
    rank = dist.get_rank()
    total = torch.ones(1)
    dist.all_reduce(total)  # hangs unless every rank evaluates
    with open(out / f"evals-rank{rank}.txt", "a") as fh:
        fh.write(f"{int(total.item())}\n")
    return gold(model, tokenizer) + 100.0 * rank  # rank 1's score is absurd: rank 0's must be used


run = run_tiny("sft", "hacked", output_dir=out / "run", max_steps=30, eval_every=6, detector="stop_at", fraction=0.4,
               world_feedback=collective_eval if all_ranks else None,
               callback_kwargs={"eval_on_all_ranks": True} if all_ranks else None)
rank = dist.get_rank() if dist.is_initialized() else 0
cb = run.callback  # every rank knows rank 0's decision and best, not only the stop flag
(out / f"rank{rank}.txt").write_text(f"stopped at {run.steps_done}, best step {cb.best_step}, "
                                     f"best score {cb.best_score:.3f}, "
                                     f"decision {cb.decision.action.value if cb.decision else None}")
if dist.is_initialized():  # every rank done before the group goes: an exit with gloo's threads running aborts
    dist.barrier()
    dist.destroy_process_group()
