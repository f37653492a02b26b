"""Multi-process training: rank 0 decides, every rank learns the decision at the same point."""

from __future__ import annotations

from typing import Any

__all__ = ["broadcast_object"]


def broadcast_object(value: Any) -> Any:
    """Rank 0's ``value`` on every rank, at the same point (no-op without torch.distributed)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return value
    box = [value if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    return box[0]

