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

from bisect import bisect_left, insort

from .config import ClusterConfig

__all__ = ["Cluster"]


class Cluster:
    """Free GPUs per node and which node GPUs each running job holds.

    Nodes are kept in buckets by their free GPUs (``_level[f]``: the nodes with exactly ``f`` free GPUs,
    in index order; full nodes are in no bucket), so a placement touches only the buckets it takes
    from instead of sorting every node: O(gpus_per_node + parts) per job, whatever the cluster's size.
    """

    __slots__ = ("total_gpus", "free", "node_free", "gpus_per_node", "pack_small_jobs", "_alloc", "_level",
                 "_pack_max")

    def __init__(self, nodes: int, gpus_per_node: int, pack_small_jobs: bool = False) -> None:
        self.total_gpus = nodes * gpus_per_node
        self.free = self.total_gpus
        self.node_free = [gpus_per_node] * nodes
        self.gpus_per_node = gpus_per_node
        self.pack_small_jobs = pack_small_jobs
        self._alloc: dict[int, list[tuple[int, int]]] = {}  # job id -> [(node, GPUs), ...]
        self._level: list[list[int]] = [[] for _ in range(gpus_per_node + 1)]
        self._level[gpus_per_node] = list(range(nodes))
        # ``g <= nodes`` (GPUs vs the number of nodes) is how packing has always been decided; the
        # recorded results depend on it, so it is kept.
        self._pack_max = min(nodes, gpus_per_node) if pack_small_jobs else 0

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
        node_free, level = self.node_free, self._level
        if g <= self._pack_max:  # best fit: the fullest node that has room, the lowest index first
            for f in range(g, self.gpus_per_node + 1):
                if level[f]:
                    node = level[f].pop(0)
                    if f > g:
                        insort(level[f - g], node)
                    node_free[node] = f - g
                    self._alloc[job_id] = [(node, g)]
                    break
            else:
                return False
        else:  # spread: the emptiest nodes first (the lowest index first among equals)
            parts, need = [], g
            for f in range(self.gpus_per_node, 0, -1):
                nodes = level[f]
                if not nodes:
                    continue
                whole = min(len(nodes), need // f)  # nodes drained completely
                if whole:
                    for node in nodes[:whole]:
                        node_free[node] = 0
                        parts.append((node, f))
                    del nodes[:whole]
                    need -= whole * f
                if need and nodes:  # the last part: less than this node has free
                    node = nodes.pop(0)
                    node_free[node] = f - need
                    insort(level[f - need], node)
                    parts.append((node, need))
                    need = 0
                if not need:
                    break
            self._alloc[job_id] = parts
        self.free -= g
        return True

    def release(self, job_id: int, gpus: int) -> None:
        """Give back every GPU ``job_id`` holds."""
        node_free, level = self.node_free, self._level
        for node, g in self._alloc.pop(job_id):
            f = node_free[node]
            if f:
                nodes = level[f]
                del nodes[bisect_left(nodes, node)]
            node_free[node] = f + g
            insort(level[f + g], node)
        self.free += gpus
