"""Placement: gang (all or none), spreading over nodes, best-fit packing, release."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from platform_sim.cluster import Cluster, Pools


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


def _pools(pack=False, **speeds):
    from tests.sim_helpers import small_config

    cfg = small_config(**{
        "cluster.pools": {"slow": {"nodes": 2, "gpus_per_node": 4}, "fast": {"nodes": 1, "gpus_per_node": 8}},
        "cluster.speeds": {"slow": 0.5, "fast": 1.0, **speeds}, "cluster.pack_small_jobs": pack,
        "cluster.type_speeds": {"rlhf_grpo": {"slow": 2.0}}})
    return Pools(cfg.cluster, ["lora_sft", "rlhf_grpo"])


def test_pools_place_a_gang_in_one_pool_the_fastest_for_its_type_first():
    p = _pools()
    assert p.total_gpus == p.free == 16
    assert p.place(0, 4, "lora_sft") and p.placed(0, "lora_sft") == ("fast", 1.0)
    assert p.place(1, 4, "rlhf_grpo") and p.placed(1, "rlhf_grpo") == ("slow", 2.0)  # rlhf_grpo's own speed: slow is its fastest
    assert p.place(2, 3, "lora_sft") and p.placed(2, "lora_sft") == ("fast", 1.0)
    assert p.place(3, 4, "lora_sft") and p.placed(3, "lora_sft") == ("slow", 0.5)  # fast has 1 left
    assert p.free == 1 and not p.place(4, 2, "lora_sft")
    p.release(1, 4)
    assert p.free == 5 and not p.place(4, 5, "lora_sft")  # 5 free, but 4 + 1 in two pools: a gang stays in one
    assert p.place(4, 4, "lora_sft") and p.allocation(4) == ("slow", ((0, 4),))
    for jid, g in ((0, 4), (2, 3), (3, 4), (4, 4)):
        p.release(jid, g)
    assert p.free == 16 and [c.free for c in p.pools] == [8, 8]


def test_pools_pack_small_jobs_within_each_pool():
    p = _pools(pack=True)
    assert p.place(0, 3, "rlhf_grpo") and p.place(1, 3, "rlhf_grpo")  # slow first for rlhf_grpo: one node each
    assert p.pools[0].node_free == [1, 1]
    assert p.place(2, 2, "rlhf_grpo") and p.placed(2, "rlhf_grpo") == ("fast", 1.0)  # 2 free in slow, not in one node


def test_the_uniform_cluster_is_a_plain_cluster():
    from platform_sim.cluster import cluster_for
    from platform_sim.config import load_config

    assert type(cluster_for(load_config().cluster, ["rlhf_grpo"])) is Cluster
