"""GPU placement: nodes, free GPUs per node, gang allocation and release.

Jobs are gang-scheduled: :meth:`Cluster.place` gives a job all its GPUs or none. By default a job
may span nodes (its GPUs are taken from the emptiest nodes first). With ``pack_small_jobs`` a job
of at most ``min(nodes, gpus_per_node)`` GPUs must fit in one node, the fullest one that still has
room (best fit).

Example::

    >>> c = Cluster(nodes=2, gpus_per_node=4, pack_small_jobs=True)
    >>> c.place(job_id=0, gpus=2), c.place(job_id=1, gpus=1)
    (True, True)
    >>> c.node_free, c.allocation(1)  # job 1 went to the fuller node that fits it (best fit)
    ([1, 4], ((0, 1),))
    >>> c.place(job_id=2, gpus=4), c.place(job_id=3, gpus=2)  # 1 GPU left: job 3 does not fit
    (True, False)
    >>> c.release(job_id=0, gpus=2)
    >>> c.free, c.node_free
    (3, [3, 0])
"""

from __future__ import annotations

from .config import ClusterConfig

__all__ = ["Cluster"]


class Cluster:
    """Free GPUs per node and which node GPUs each running job holds."""

    __slots__ = ("total_gpus", "free", "node_free", "gpus_per_node", "pack_small_jobs", "_alloc")

    def __init__(self, nodes: int, gpus_per_node: int, pack_small_jobs: bool = False) -> None:
        self.total_gpus = nodes * gpus_per_node
        self.free = self.total_gpus
        self.node_free = [gpus_per_node] * nodes
        self.gpus_per_node = gpus_per_node
        self.pack_small_jobs = pack_small_jobs
        self._alloc: dict[int, list[tuple[int, int]]] = {}  # job id -> [(node, GPUs), ...]

    @classmethod
    def from_config(cls, cfg: ClusterConfig) -> Cluster:
        return cls(cfg.nodes, cfg.gpus_per_node, cfg.pack_small_jobs)

    def allocation(self, job_id: int) -> tuple[tuple[int, int], ...]:
        """The ``(node, GPUs)`` parts a running job holds."""
        return tuple(self._alloc[job_id])

    def place(self, job_id: int, gpus: int) -> bool:
        """Allocate ``gpus`` GPUs to ``job_id`` (all or none); False if they do not fit now."""
        g = gpus
        if g > self.free:
            return False
        node_free = self.node_free
        # ``g <= len(node_free)`` (GPUs vs the number of nodes) is how packing has always been decided;
        # the recorded results depend on it, so it is kept.
        if self.pack_small_jobs and g <= len(node_free) and g <= self.gpus_per_node:
            fitting = [i for i, f in enumerate(node_free) if f >= g]
            if not fitting:
                return False
            node = min(fitting, key=lambda i: (node_free[i], i))  # best fit
            node_free[node] -= g
            self._alloc[job_id] = [(node, g)]
        else:
            parts, need = [], g
            for i in sorted(range(len(node_free)), key=lambda i: -node_free[i]):
                take = min(need, node_free[i])
                if take:
                    node_free[i] -= take
                    parts.append((i, take))
                    need -= take
                if not need:
                    break
            self._alloc[job_id] = parts
        self.free -= g
        return True

    def release(self, job_id: int, gpus: int) -> None:
        """Give back every GPU ``job_id`` holds."""
        node_free = self.node_free
        for node, g in self._alloc.pop(job_id):
            node_free[node] += g
        self.free += gpus
