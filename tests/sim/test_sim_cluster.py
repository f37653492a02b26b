"""Placement: gang (all or none), spreading over nodes, best-fit packing, release."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_sim.cluster import Cluster


@pytest.mark.parametrize("pack, requests, placed, node_free", [
    # spread: each job takes GPUs from the emptiest nodes first
    (False, [3, 5], [True, True], [0, 0]),
    (False, [3, 3, 3], [True, True, False], [1, 1]),  # gang: all or none (2 free GPUs are not 3)
    (False, [9], [False], [4, 4]),
    (False, [3, 3, 2], [True, True, True], [0, 0]),  # the 2-GPU job spans both nodes
    # pack: a job of <= min(nodes, gpus_per_node) GPUs goes to the fullest node with room (best fit)
    (True, [3, 3, 2], [True, True, False], [1, 1]),  # 2 GPUs free, but not in one node
    (True, [1, 1, 2], [True, True, True], [0, 4]),
    (True, [2, 1], [True, True], [1, 4]),
])
def test_placement(pack, requests, placed, node_free):
    c = Cluster(nodes=2, gpus_per_node=4, pack_small_jobs=pack)
    assert [c.place(i, g) for i, g in enumerate(requests)] == placed
    assert c.node_free == node_free and c.free == sum(node_free)


@given(st.lists(st.tuples(st.booleans(), st.integers(1, 12)), max_size=30), st.booleans())
def test_free_gpus_are_conserved(ops, pack):
    c = Cluster(nodes=3, gpus_per_node=4, pack_small_jobs=pack)
    held: dict[int, int] = {}
    for i, (release, g) in enumerate(ops):
        if release and held:
            jid = next(iter(held))
            c.release(jid, held.pop(jid))
        elif c.place(i, g):
            held[i] = g
            assert sum(n for _, n in c.allocation(i)) == g
        assert c.free == sum(c.node_free) == 12 - sum(held.values()) and min(c.node_free) >= 0


class SortedCluster:
    """The reference placement: sort every node per job (what Cluster did before its free-GPU buckets)."""

    def __init__(self, nodes, gpus_per_node, pack):
        self.node_free, self.gpn, self.pack, self.alloc = [gpus_per_node] * nodes, gpus_per_node, pack, {}

    def place(self, job_id, g):
        node_free = self.node_free
        if g > sum(node_free):
            return False
        if self.pack and g <= len(node_free) and g <= self.gpn:
            fitting = [i for i, f in enumerate(node_free) if f >= g]
            if not fitting:
                return False
            node = min(fitting, key=lambda i: (node_free[i], i))
            node_free[node] -= g
            self.alloc[job_id] = [(node, g)]
            return True
        parts, need = [], g
        for i in sorted(range(len(node_free)), key=lambda i: -node_free[i]):
            take = min(need, node_free[i])
            if take:
                node_free[i] -= take
                parts.append((i, take))
                need -= take
            if not need:
                break
        self.alloc[job_id] = parts
        return True

    def release(self, job_id):
        for node, g in self.alloc.pop(job_id):
            self.node_free[node] += g


@given(st.lists(st.tuples(st.booleans(), st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16])), max_size=60), st.booleans(),
       st.sampled_from([(3, 4), (5, 8), (16, 8)]), st.randoms(use_true_random=False))
def test_buckets_place_exactly_like_sorting_every_node(ops, pack, shape, rnd):
    c, ref = Cluster(*shape, pack_small_jobs=pack), SortedCluster(*shape, pack)
    held: dict[int, int] = {}
    for i, (release, g) in enumerate(ops):
        if release and held:
            jid = rnd.choice(sorted(held))
            c.release(jid, held.pop(jid))
            ref.release(jid)
        else:
            placed = c.place(i, g)
            assert placed == ref.place(i, g)
            if placed:
                held[i] = g
                assert list(c.allocation(i)) == ref.alloc[i]
        assert c.node_free == ref.node_free
