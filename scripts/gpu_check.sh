#!/usr/bin/env bash
# One short check for a lent GPU (never run in CI): seconds per GRPO step of the tiny job at its
# larger CUDA size (hidden 256, 4 layers, batch 32) with EvalStop in the loop, and that a hacked
# run is stopped. Needs a venv with a CUDA build of torch: TORCH_SPEC=torch make setup
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
"$PY" - <<'PY'
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print("device:", torch.cuda.get_device_name(0), "| torch", torch.__version__)
PY
out=$(mktemp -d)
"$PY" scripts/tiny_rlhf.py --device cuda --trainer grpo --preset hacked --max-steps 300 --eval-every 15 \
  --output-dir "$out/hacked" | grep '^RESULT' | cut -c8- > "$out/result.json"
"$PY" - "$out/result.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"hacked GRPO on cuda: {r['steps_done']} steps in {r['seconds']:.1f} s "
      f"({r['seconds'] / max(r['steps_done'], 1):.3f} s/step incl. evals); stopped at {r['stopped_at']}: {r['reason']}")
PY
