"""platform_sim: a discrete-event simulator of a shared GPU platform with EvalStop.

64 virtual GPUs, seeded synthetic LoRA/DPO/RLHF workloads with hidden gold-reward curves, base
schedulers (FIFO, SJF-Est, SRTF-Est, LossAware) and stop overlays (EvalStop through the real
``evalstop_trl.Coordinator``, StopAt, LossPlateau, Oracle). See ``simulator-spec.md``.
"""

from typing import Any

__all__ = ["SimConfig", "load_config"]


def __getattr__(name: str) -> Any:  # lazy: `platform-sim` says which extra to install when numpy is missing
    if name in __all__:
        from . import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
