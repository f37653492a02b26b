"""Run by test_callback.py under torch.distributed.run with 2 CPU processes (gloo)."""

import sys
from pathlib import Path

import torch.distributed as dist

from evalstop_trl.train.tiny import run_tiny

out = Path(sys.argv[1])
run = run_tiny("sft", "hacked", output_dir=out / "run", max_steps=30, eval_every=6, detector="stop_at", fraction=0.4)
rank = dist.get_rank() if dist.is_initialized() else 0
cb = run.callback  # every rank knows rank 0's decision and best, not only the stop flag
(out / f"rank{rank}.txt").write_text(f"stopped at {run.steps_done}, best step {cb.best_step}, "
                                     f"decision {cb.decision.action.value if cb.decision else None}")
