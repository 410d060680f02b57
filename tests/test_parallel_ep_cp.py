"""Expert parallelism's all-to-all and context parallelism's ring attention: the cost formulas of
``course_lib.parallel.cost`` against simulations that move real buffers (one process, p simulated ranks)."""
from __future__ import annotations

import pytest
import torch

from course_lib.attention.reference import reference_attention
from course_lib.parallel.cost import (LINKS, Link, alltoall_bytes, alltoall_time, ep_dispatch_rows, ep_moe_layer_comm,
                                      load_imbalance, rank_loads, ring_attention_comm, ring_attention_overlap,
                                      simulate_ep_dispatch, simulate_ring_attention)
from course_lib.sparsity.moe import TopKRouter


def test_alltoall_formula():
    assert alltoall_bytes(1000, 1) == 0 and alltoall_bytes(1000, 4) == 750
    link = LINKS["pcie5"]
    assert alltoall_time(1000, 1, "pcie5") == 0.0
    assert alltoall_time(1000, 4, link) == pytest.approx(3 * link.latency + 750 / link.bandwidth)


@pytest.mark.parametrize("p,E,k", [(2, 4, 1), (4, 8, 2), (4, 16, 2), (8, 8, 1)])
def test_ep_uniform_routing_is_exact(p, E, k):
    T = 2 * E                       # token t's j-th choice is expert (t k + j) mod E: every rank gets T k / p
    ids = (torch.arange(T * k).view(T, k) % E).expand(p, T, k).contiguous()
    hidden = 8
    sim = simulate_ep_dispatch(ids, E, hidden=hidden, dtype=torch.float16)
    model = ep_moe_layer_comm(T, hidden, k, p, bpe=2)
    assert sim["sent"] == [model["sent_bytes_per_alltoall"]] * p
    assert sim["received"] == [model["sent_bytes_per_alltoall"]] * p
    assert model["imbalance"] == 1.0 and model["sent_bytes_per_layer"] == 2 * sim["sent"][0]


def test_ep_skewed_routing_from_the_router():
    torch.manual_seed(0)
    p, E, k, T, hidden = 4, 8, 2, 512, 16
    router = TopKRouter(hidden, E, k)
    with torch.no_grad():
        router.gate.weight[0] += 0.05      # inputs of positive mean favour expert 0: skewed routing
        _, ids, _ = router(torch.randn(p * T, hidden) + 0.5)
    ids = ids.view(p, T, k)
    load = torch.bincount(ids.reshape(-1), minlength=E)
    sim = simulate_ep_dispatch(ids, E, hidden=hidden, dtype=torch.float32)
    assert sim["rank_load"] == rank_loads(load, p).tolist()
    imb = load_imbalance(load, p)
    assert imb > 1.2                                               # the skew shows in the statistics
    model = ep_moe_layer_comm(T, hidden, k, p, bpe=4, load=load, link="nvlink4")
    row = hidden * 4
    # the most loaded rank receives at most all its assignments' rows, and (tokens from every rank alike)
    # about (p-1)/p of them: the model's max-rank volume, within sampling noise
    assert max(sim["received"]) <= max(sim["rank_load"]) * row
    assert max(sim["received"]) == pytest.approx(model["max_rank_bytes_per_layer"] / 2, rel=0.05)
    assert sum(sim["sent"]) == sum(sim["received"])
    assert sum(sim["received"]) == pytest.approx(p * model["sent_bytes_per_alltoall"], rel=0.05)
    assert model["comm_s"] == pytest.approx(2 * alltoall_time(imb * T * k * row, p, "nvlink4"))


def _brute_force_rows(experts, E):
    """Per source rank: rows sent once per off-rank assignment, and once per off-rank (token, rank) pair."""
    p, T, k = experts.shape
    per = E // p
    by_assignment, by_rank = [0] * p, [0] * p
    for src in range(p):
        for t in range(T):
            ranks = [int(e) // per for e in experts[src, t]]
            by_assignment[src] += sum(r != src for r in ranks)
            by_rank[src] += len({r for r in ranks if r != src})
    return by_assignment, by_rank


def _routing(p, T, k, E, gen, skew=0.0):
    """k distinct experts per token, drawn with weights exp(-skew * expert): skew 0 is uniform."""
    w = torch.exp(-skew * torch.arange(E, dtype=torch.float64)).expand(p * T, E)
    return torch.multinomial(w, k, replacement=False, generator=gen).view(p, T, k)


@pytest.mark.parametrize("p,E,k", [(1, 4, 2), (2, 4, 2), (4, 8, 2), (4, 16, 4), (8, 8, 2), (3, 12, 3), (2, 8, 8)])
@pytest.mark.parametrize("skew", [0.0, 0.7])
def test_ep_dispatch_rows_against_a_brute_force_count(p, E, k, skew):
    gen = torch.Generator().manual_seed(1000 * p + 10 * E + k)
    for _ in range(3):
        ids = _routing(p, 16, k, E, gen, skew)
        rows = ep_dispatch_rows(ids, E)
        by_assignment, by_rank = _brute_force_rows(ids, E)
        assert rows["per_assignment"] == by_assignment and rows["per_rank"] == by_rank
        # the upper bound is what the simulation moves, row for row
        sim = simulate_ep_dispatch(ids, E, hidden=4, dtype=torch.float32)
        assert [b // sim["bytes_per_row"] for b in sim["sent"]] == rows["per_assignment"]
        assert all(r <= a for r, a in zip(by_rank, by_assignment))
        total = sum(by_assignment)
        assert rows["ratio"] == (sum(by_rank) / total if total else 1.0)
        if E == p:                       # one expert per rank, distinct experts per token: nothing to merge
            assert rows["ratio"] == 1.0


def test_ep_dispatch_rows_merges_a_token_whose_experts_share_a_rank():
    # 2 ranks of 2 experts; rank 0's token 0 picks experts 2 and 3 (both on rank 1): 2 assignments, 1 row
    ids = torch.tensor([[[2, 3], [0, 2]], [[0, 1], [2, 3]]])
    rows = ep_dispatch_rows(ids, 4)
    assert rows == {"per_assignment": [3, 2], "per_rank": [2, 1], "ratio": 3 / 5}
    # a skewed router (popular experts 0 and 1 on one rank) merges more than a uniform one
    gen = torch.Generator().manual_seed(0)
    even, skewed = (ep_dispatch_rows(_routing(4, 512, 2, 8, gen, s), 8)["ratio"] for s in (0.0, 1.0))
    assert skewed < even < 1.0


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_ring_attention_equals_full_attention_and_counts_bytes(p, causal):
    torch.manual_seed(p)
    B, H, K, N, Dh = 2, 4, 2, 24, 8                                # GQA: 2 query heads per KV head
    q, k, v = torch.randn(B, H, N, Dh), torch.randn(B, K, N, Dh), torch.randn(B, K, N, Dh)
    out, sent = simulate_ring_attention(q, k, v, p, causal=causal)
    torch.testing.assert_close(out, reference_attention(q, k, v, causal=causal), atol=1e-5, rtol=1e-5)
    comm = ring_attention_comm(N, K, Dh, p, bpe=4)                 # per batch element: B sequences in flight
    assert sent == [B * comm["sent_bytes_per_layer"]] * p
    assert comm["sent_bytes_per_layer"] == (p - 1) / p * 2 * N * K * Dh * 4


def test_ring_overlap_condition():
    # multi-head attention in 2-byte elements, no latency: the block must hold flops / bandwidth tokens
    ideal = Link("ideal", 100e9, 0.0)
    o = ring_attention_overlap(8, 8, 64, ideal, 1e14)
    assert o["bandwidth_bound_tokens"] == pytest.approx(1e14 / 100e9)
    assert o["min_block_tokens"] == 1000
    at = ring_attention_overlap(8, 8, 64, ideal, 1e14, block_tokens=o["min_block_tokens"])
    assert at["overlaps"] and not ring_attention_overlap(8, 8, 64, ideal, 1e14, block_tokens=999)["overlaps"]
    # latency raises the minimum; a slower link raises it in proportion to 1 / bandwidth
    assert ring_attention_overlap(8, 8, 64, "pcie5", 1e14)["min_block_tokens"] > \
        ring_attention_overlap(8, 8, 64, "nvlink4", 1e14)["min_block_tokens"]


@pytest.mark.parametrize("call,arg", [
    (lambda: alltoall_bytes(10, 0), "p"),
    (lambda: alltoall_bytes(-1, 2), "nbytes_per_rank"),
    (lambda: ep_moe_layer_comm(0, 8, 2, 2), "tokens"),
    (lambda: ep_moe_layer_comm(4, 8, 2, 2, bpe=0), "bpe"),
    (lambda: ep_moe_layer_comm(4, 8, 2, 3, load=[1, 2, 3, 4]), "p=3"),
    (lambda: load_imbalance([1.5, 2.0], 2), "load"),
    (lambda: load_imbalance([0, 0], 2), "load"),
    (lambda: ring_attention_comm(10, 2, 8, 3), "p=3"),
    (lambda: ring_attention_comm(12, 0, 8, 3), "kv_heads"),
    (lambda: ring_attention_overlap(8, 8, 64, "nvlink4", 0), "flops"),
    (lambda: ring_attention_overlap(8, 8, 64, "nvlink9", 1e12), "link"),
    (lambda: simulate_ring_attention(torch.zeros(1, 1, 6, 4), torch.zeros(1, 1, 6, 4), torch.zeros(1, 1, 6, 4), 4),
     "p=4"),
    (lambda: simulate_ep_dispatch(torch.zeros(2, 3, 1, dtype=torch.long), 3), "num_experts"),
    (lambda: simulate_ep_dispatch(torch.full((2, 3, 1), 5), 4), "experts"),
    (lambda: ep_dispatch_rows(torch.zeros(2, 3, dtype=torch.long), 4), "experts"),
    (lambda: ep_dispatch_rows(torch.zeros(2, 3, 1), 4), "experts"),
    (lambda: ep_dispatch_rows(torch.zeros(3, 2, 1, dtype=torch.long), 4), "p=3"),
    (lambda: ep_dispatch_rows(torch.full((2, 3, 1), -1), 4), "experts"),
])
def test_bad_arguments_are_refused(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()
