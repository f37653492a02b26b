"""GPU placement: nodes, free GPUs per node, gang allocation and release; pools of GPU models.

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

A mixed cluster (``cluster.pools`` in the config) is :class:`Pools`: one :class:`Cluster` per GPU
model; a gang runs in one pool, the fastest for its job type that has room (:func:`cluster_for`).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable

from .config import ClusterConfig

__all__ = ["Cluster", "Pools", "cluster_for"]


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

    def place(self, job_id: int, gpus: int, job_type: str = "", pool: str | None = None) -> bool:
        """Allocate ``gpus`` GPUs to ``job_id`` (all or none); False if they do not fit now.

        ``job_type`` and ``pool`` are for :class:`Pools`; every GPU here is the same (one pool, ``""``)."""
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


class Pools:
    """A mixed cluster: one :class:`Cluster` per GPU model (pool); a gang runs in one pool.

    A job goes to the pool fastest for its type that has room (ties: the pool listed first), what a
    heterogeneity-unaware platform that prefers its best free GPUs does; ``free`` and
    ``total_gpus`` count every pool, so a plan by count may pick a job no single pool can hold
    (placement then refuses it, as it does a fragmented node with ``pack_small_jobs``).

    Example::

        >>> from platform_sim.config import ClusterConfig, PoolConfig
        >>> cfg = ClusterConfig(nodes=1, gpus_per_node=1, pack_small_jobs=False, type_speeds={},
        ...                     pools={"t4": PoolConfig(1, 4), "a100": PoolConfig(1, 8)}, speeds={"t4": 0.25, "a100": 1.0})
        >>> p = Pools(cfg, ["sft"])
        >>> p.place(0, 8, "sft"), p.placed(0, "sft"), p.place(1, 4, "sft"), p.placed(1, "sft")
        (True, ('a100', 1.0), True, ('t4', 0.25))
        >>> p.place(2, 1, "sft"), p.free  # every pool is full
        (False, 0)
    """

    __slots__ = ("names", "pools", "total_gpus", "free", "_order", "_speed", "_where")

    def __init__(self, cfg: ClusterConfig, job_types: Iterable[str]) -> None:
        items = cfg.pool_list()
        self.names = tuple(name for name, _ in items)
        self.pools = tuple(Cluster(p.nodes, p.gpus_per_node, cfg.pack_small_jobs) for _, p in items)
        self.total_gpus = self.free = sum(c.total_gpus for c in self.pools)
        self._speed = {t: tuple(cfg.speed(name, t) for name in self.names) for t in job_types}
        self._order = {t: tuple(sorted(range(len(self.names)), key=lambda i, s=s: -s[i])) for t, s in self._speed.items()}
        self._where: dict[int, int] = {}  # job id -> pool index

    def place(self, job_id: int, gpus: int, job_type: str = "", pool: str | None = None) -> bool:
        """Allocate ``gpus`` GPUs of one pool to ``job_id``: ``pool``'s, or the fastest pool for
        ``job_type`` that has room (None)."""
        if gpus > self.free:
            return False
        pools = self.pools
        for i in self._order[job_type] if pool is None else (self.names.index(pool),):
            if pools[i].place(job_id, gpus):
                self._where[job_id] = i
                self.free -= gpus
                return True
        return False

    def placed(self, job_id: int, job_type: str) -> tuple[str, float]:
        """(pool, speed) of a running job: where it runs and how fast, in reference GPUs."""
        i = self._where[job_id]
        return self.names[i], self._speed[job_type][i]

    def allocation(self, job_id: int) -> tuple[str, tuple[tuple[int, int], ...]]:
        """The pool and the ``(node, GPUs)`` parts a running job holds there."""
        i = self._where[job_id]
        return self.names[i], self.pools[i].allocation(job_id)

    def release(self, job_id: int, gpus: int) -> None:
        """Give back every GPU ``job_id`` holds."""
        self.pools[self._where.pop(job_id)].release(job_id, gpus)
        self.free += gpus


def cluster_for(cfg: ClusterConfig, job_types: Iterable[str]) -> Cluster | Pools:
    """The placement of ``cfg``: a :class:`Cluster` for the uniform cluster, :class:`Pools` for a mixed one."""
    return Pools(cfg, job_types) if cfg.pools else Cluster.from_config(cfg)
