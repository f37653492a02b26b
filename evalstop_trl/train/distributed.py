"""Multi-process training: rank 0 decides, every rank learns the decision at the same point."""

from __future__ import annotations

__all__ = ["broadcast_stop"]


def broadcast_stop(stop: bool) -> bool:
    """Rank 0's decision on every rank, at the same point (no-op without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return stop
    flag = [stop if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(flag, src=0)
    return bool(flag[0])
