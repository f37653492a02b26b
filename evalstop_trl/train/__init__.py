"""Training-side integration: ``EvalStopCallback`` for transformers/TRL trainers and tiny real RLHF
jobs. The only part of evalstop that imports torch."""
