#!/usr/bin/env bash
# A verl GRPO run stopped by EvalStop from its own validation metric, with no code change in verl.
#
# verl's file logger (trainer.logger includes 'file'; verl/utils/tracking.py) writes one line per step
# to $VERL_FILE_LOGGER_PATH: {"step": N, "elapsed_seconds": ..., "data": {...}}; its validation metrics
# (every trainer.test_freq steps) are named val-core/<data_source>/<reward key>/mean@<n>. The launcher
# follows that file, reports the metric as the job's eval, and on a stop sends SIGTERM to the run
# (then SIGKILL after --grace-s). Needs GPUs (verl has no CPU path); the same path is tested on a real
# child that writes verl's format (tests/launcher/test_metric_from.py).
set -euo pipefail
OUT=${OUT:-runs/verl-grpo}
mkdir -p "$OUT"
export VERL_FILE_LOGGER_PATH="$OUT/metrics.jsonl"

evalstop run --url "${EVALSTOP_URL:?set EVALSTOP_URL (evalstop serve)}" --token-file "${TOKEN_FILE:?}" \
  --job-id "${JOB_ID:-verl-grpo-gsm8k}" --job-type grpo --grace-s 120 \
  --metric-from "jsonl:$VERL_FILE_LOGGER_PATH" --metric "val-core/openai/gsm8k/reward/mean@1" -- \
  python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$HOME/data/gsm8k/train.parquet" data.val_files="$HOME/data/gsm8k/test.parquet" \
    actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct \
    trainer.logger='["console","file"]' trainer.test_freq=10 trainer.total_training_steps=500 \
    trainer.default_local_dir="$OUT/checkpoints" trainer.save_freq=10
