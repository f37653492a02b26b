#!/usr/bin/env bash
# An OpenRLHF run stopped by EvalStop from the TensorBoard scalars it writes, with no code change.
#
# OpenRLHF evaluates every --eval_steps and logs to TensorBoard under --use_tensorboard DIR; the
# launcher follows the event files under DIR (new files and events as they appear) and reports the
# scalar of --metric TAG as the job's eval; on a stop it sends SIGTERM to the run (then SIGKILL after
# --grace-s). Pick TAG from your run's TensorBoard (the eval scalar of your dataset). Needs GPUs
# (OpenRLHF pins DeepSpeed and flash-attn); the same path is tested on a real child that writes
# TensorBoard events (tests/launcher/test_metric_from.py).
set -euo pipefail
OUT=${OUT:-runs/openrlhf}
TAG=${TAG:?the TensorBoard tag of the eval score your run logs}
mkdir -p "$OUT/tensorboard"

evalstop run --url "${EVALSTOP_URL:?set EVALSTOP_URL (evalstop serve)}" --token-file "${TOKEN_FILE:?}" \
  --job-id "${JOB_ID:-openrlhf-ppo}" --job-type rlhf --grace-s 120 \
  --metric-from "tensorboard:$OUT/tensorboard" --metric "$TAG" -- \
  python3 -m openrlhf.cli.train_ppo_ray \
    --pretrain "${MODEL:?}" --reward_pretrain "${REWARD_MODEL:?}" \
    --prompt_data "${PROMPTS:?}" --eval_steps 20 \
    --save_path "$OUT/final" --ckpt_path "$OUT/ckpt" --use_tensorboard "$OUT/tensorboard" \
    "$@"  # your run's own flags: its eval data, batch sizes, Ray and vLLM settings
