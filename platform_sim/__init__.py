"""platform_sim: a discrete-event simulator of a shared GPU platform with EvalStop.

64 virtual GPUs, seeded synthetic LoRA/DPO/RLHF workloads with hidden gold-reward curves, base
schedulers (FIFO, SJF-Est, SRTF-Est, LossAware) and stop overlays (EvalStop through the real
``evalstop_trl.Coordinator``, StopAt, LossPlateau, Oracle). See ``simulator-spec.md``.
"""

from .config import SimConfig, load_config

__all__ = ["SimConfig", "load_config"]
