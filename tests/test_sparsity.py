"""course_lib.sparsity: masks against torch.nn.utils.prune, Wanda and 2:4, structured pruning that shrinks
the model with the masked model's logits, MoE dispatch against the per-token loop, sparse attention masks."""
import copy

import pytest
import torch

from course_lib import sparsity as S
from course_lib.models.config import LlamaConfig
from course_lib.models.llama import LlamaForCausalLM

CFG = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64)


def small_model(seed=0, device="cpu"):
    torch.manual_seed(seed)
    return LlamaForCausalLM(CFG).to(device).eval()


def ids(n=3, T=16, seed=1, device="cpu"):
    g = torch.Generator(device="cpu").manual_seed(seed)
    return torch.randint(0, CFG.vocab_size, (n, T), generator=g).to(device)


# --- magnitude pruning: ours equals torch.nn.utils.prune -------------------------------------------------
@pytest.mark.parametrize("scope", ["global", "layer"])
@pytest.mark.parametrize("amount", [0.0, 0.3, 0.55, 0.9])
def test_magnitude_equals_torch_prune(scope, amount):
    m = small_model()
    ours, theirs = S.magnitude_masks(m, amount, scope), S.torch_prune_masks(m, amount, scope)
    assert ours.keys() == theirs.keys()
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), name
    total = sum(v.numel() for v in ours.values())
    removed = sum(int((~v).sum()) for v in ours.values())
    assert removed == round(amount * total) if scope == "global" else removed == sum(
        round(amount * v.numel()) for v in ours.values())


def test_masks_held_through_training_and_baked():
    m = small_model()
    S.magnitude_prune(m, 0.5, "layer")
    x = ids(2, 17)
    opt = torch.optim.SGD(m.parameters(), lr=0.5)
    for _ in range(3):
        loss = torch.nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, CFG.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(); loss.backward(); opt.step()
    before = S.sparsity(m)["overall"]
    assert abs(before - 0.5) < 1e-3
    logits = m(x)
    S.bake_masks(m)
    assert not S.current_masks(m)
    assert S.sparsity(m)["overall"] == before
    torch.testing.assert_close(m(x), logits)
    S.magnitude_prune(m, 0.75, "global")                                    # cumulative: old zeros go first
    assert abs(S.sparsity(m)["overall"] - 0.75) < 1e-3


def test_apply_masks_errors():
    m = small_model()
    with pytest.raises(ValueError, match="not a prunable"):
        S.apply_masks(m, {"lm_head": torch.ones(2, dtype=torch.bool)})
    name = "model.layers.0.mlp.up_proj"
    with pytest.raises(ValueError, match="bool tensor"):
        S.apply_masks(m, {name: torch.ones(3, 3, dtype=torch.bool)})
    with pytest.raises(ValueError, match="sparsity"):
        S.magnitude_masks(m, 1.5)
    with pytest.raises(ValueError, match="scope"):
        S.magnitude_masks(m, 0.5, "row")


# --- 2:4 and Wanda -------------------------------------------------------------------------------------
def test_nm_mask_exact_and_best():
    g = torch.Generator(device="cpu").manual_seed(0)
    s = torch.rand(7, 32, generator=g)
    mask = S.nm_mask(s, 2, 4)
    assert S.is_nm(mask, 2, 4, exact=True)
    grp = s.reshape(7, 8, 4)
    kept = (s * mask).reshape(7, 8, 4).sum(-1)
    assert torch.allclose(kept, grp.topk(2, -1).values.sum(-1))
    assert S.is_nm(torch.zeros(4, 8), 2, 4, exact=True) is False and S.is_nm(torch.zeros(4, 8), 2, 4)
    tie = S.nm_mask(torch.ones(2, 8), 2, 4)                                # ties: still exactly 2 of 4
    assert S.is_nm(tie, 2, 4, exact=True)
    with pytest.raises(ValueError, match="multiple of m"):
        S.nm_mask(torch.rand(3, 6))
    with pytest.raises(ValueError, match="n must be at most m"):
        S.nm_mask(torch.rand(3, 8), 5, 4)


def test_wanda_mask_against_a_plain_loop():
    g = torch.Generator(device="cpu").manual_seed(3)
    w, xn = torch.randn(6, 16, generator=g), torch.rand(16, generator=g) * 5
    mask = S.wanda_mask(w, xn, sparsity=0.5)
    for r in range(6):
        score = [abs(w[r, j].item()) * xn[j].item() for j in range(16)]
        kept = sorted(range(16), key=lambda j: score[j])[8:]
        assert sorted(torch.nonzero(mask[r]).flatten().tolist()) == sorted(kept)
    m24 = S.wanda_mask(w, xn, n=2, m=4)
    assert S.is_nm(m24, 2, 4, exact=True) and S.is_nm(w * m24, 2, 4)
    # an input feature with a huge norm keeps its weights under Wanda, not under magnitude alone
    xn2 = torch.ones(16); xn2[5] = 100.0
    w2 = w.clone(); w2[:, 5] = 0.01
    assert S.wanda_mask(w2, xn2, sparsity=0.5)[:, 5].all()
    assert not S.wanda_mask(w2, torch.ones(16), sparsity=0.5)[:, 5].any()   # equal norms: magnitude per row
    with pytest.raises(ValueError, match="x_norm"):
        S.wanda_mask(w, torch.ones(3))


def test_input_norms_match_a_manual_capture():
    m = small_model()
    x = ids(4, 12)
    norms = S.input_norms(m, x, batch_size=3)
    with torch.no_grad():
        h = m.model.embed_tokens(x)
        want = m.model.layers[0].input_layernorm(h).reshape(-1, CFG.hidden_size).norm(dim=0)
    torch.testing.assert_close(norms["model.layers.0.self_attn.q_proj"], want, rtol=1e-5, atol=1e-5)
    masks = S.wanda_masks(m, x, n=2, m=4)
    assert all(S.is_nm(v, 2, 4, exact=True) for v in masks.values())


def test_memory_arithmetic():
    assert S.semi_structured_bytes(128, 256, 2) / S.dense_bytes(128, 256, 2) == 0.5625
    assert S.csr_break_even_density(2, 4) == pytest.approx(1 / 3)
    assert S.csr_bytes(100, 100, 0.5, 2, 4) > S.dense_bytes(100, 100, 2)   # 50% sparse CSR is larger
    assert S.csr_bytes(100, 100, 0.2, 2, 4) < S.dense_bytes(100, 100, 2)


@pytest.mark.gpu
def test_semi_structured_speed_on_gpu():
    r = S.semi_structured_speed(rows=2048, cols=2048, tokens=2048, repeats=20)
    if r is None:
        pytest.skip("no sparse tensor cores (compute capability < 8.0)")
    print(r)
    assert r["max_abs_diff"] < 0.5 and r["dense_ms"] > 0 and r["sparse_ms"] > 0


# --- structured ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["weight", "taylor"])
def test_shrunk_model_equals_masked_model(method, device):
    m = small_model(device=device)
    x = ids(3, 17, device=device)
    scores = S.unit_importance(m, method, ids=x)
    assert scores["heads"].shape == (3, 4) and scores["neurons"].shape == (3, 48) and scores["layers"].shape == (3,)
    for kw in ({"heads_per_group": 1, "neurons": 20}, {"kv_groups": 1, "neurons": 30, "layers": 2},
               {"heads_per_group": 1, "kv_groups": 1, "layers": 1}):
        plan = S.make_plan(m, scores, **kw)
        small = S.shrink(m, plan)
        masked = S.masked_copy(m, plan)
        assert small.num_parameters() < m.num_parameters()
        assert small.config.num_parameters() == small.num_parameters()
        assert small.config.num_attention_heads % small.config.num_key_value_heads == 0
        tol = dict(rtol=1e-4, atol=1e-4) if device.type == "cpu" else dict(rtol=1e-3, atol=1e-3)
        with torch.no_grad():
            torch.testing.assert_close(small(x), masked(x), **tol)


def test_structured_plan_checks():
    m = small_model()
    scores = S.unit_importance(m, "weight")
    plan = S.make_plan(m, scores, heads_per_group=1)
    bad = copy.deepcopy(plan)
    bad.heads[0] = [0, 1, 2]                                                # group 0 keeps 2, group 1 keeps 1
    with pytest.raises(ValueError, match="same number of query heads"):
        S.shrink(m, bad)
    bad = copy.deepcopy(plan)
    bad.neurons[1] = bad.neurons[1][:-1]
    with pytest.raises(ValueError, match="same number"):
        S.shrink(m, bad)
    with pytest.raises(ValueError, match="heads_per_group"):
        S.make_plan(m, scores, heads_per_group=3)
    with pytest.raises(ValueError, match="method"):
        S.unit_importance(m, "random")


def test_taylor_score_is_the_loss_change_to_first_order():
    # Removing the lowest-Taylor neuron changes the loss less than removing the highest one.
    m = small_model(seed=2)
    x = ids(4, 17, seed=5)
    sc = S.unit_importance(m, "taylor", ids=x)["neurons"][0]
    def loss_without(j):
        mm = copy.deepcopy(m)
        with torch.no_grad():
            mm.model.layers[0].mlp.down_proj.weight[:, j] = 0
            logits = mm(x[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, CFG.vocab_size), x[:, 1:].reshape(-1)).item()
    with torch.no_grad():
        base = torch.nn.functional.cross_entropy(m(x[:, :-1]).reshape(-1, CFG.vocab_size), x[:, 1:].reshape(-1)).item()
    assert abs(loss_without(int(sc.argmin())) - base) < abs(loss_without(int(sc.argmax())) - base)


def test_structured_prune_and_iterative():
    m = small_model()
    x = ids(4, 17)
    small = S.structured_prune(m, 0.5, "taylor", ids=x)
    assert small.config.num_attention_heads == 2 and small.config.intermediate_size == 24
    stream = torch.randint(0, CFG.vocab_size, (500,), generator=torch.Generator(device="cpu").manual_seed(0))
    pruned, losses = S.iterative_prune(small_model(), lambda mm, s: S.magnitude_prune(mm, s), 0.6, rounds=2,
                                       stream=stream, steps_per_round=2, batch_size=2, seq_len=16)
    assert len(losses) == 2 and abs(S.sparsity(pruned)["overall"] - 0.6) < 1e-3


# --- MoE ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cf", [None, 1.0, 0.5])
def test_dispatch_equals_loop(cf, device):
    torch.manual_seed(0)
    N, D, E, k = 37, 8, 4, 2
    moe = S.MoEMLP(D, 12, E, k, capacity_factor=cf).to(device)
    x = torch.randn(N, D, device=device)
    w, idx, probs = moe.router(x)
    idx[:20, 0] = 1                                                        # make expert 1 overflow
    cap = S.expert_capacity(N, E, k, cf)
    y1, load1, d1 = S.dispatch_loop(x, moe.experts, w, idx, cap)
    y2, load2, d2 = S.dispatch(x, moe.experts, w, idx, cap)
    torch.testing.assert_close(y1, y2, rtol=1e-5, atol=1e-5)
    assert torch.equal(load1, load2) and d1 == d2
    assert (d1 > 0) == (cf is not None) and int(load1.max()) <= cap and int(load1.sum()) + d1 == N * k


def test_router_and_balancing_loss():
    torch.manual_seed(0)
    r = S.TopKRouter(8, 4, 2)
    w, idx, probs = r(torch.randn(10, 8))
    torch.testing.assert_close(w.sum(-1), torch.ones(10))
    assert (w[:, 0] >= w[:, 1]).all()
    even = torch.full((8, 4), 0.25)
    assert S.load_balancing_loss(even, torch.arange(8).reshape(4, 2) % 4).item() == pytest.approx(1.0)
    onehot = torch.zeros(8, 4); onehot[:, 0] = 1
    assert S.load_balancing_loss(onehot, torch.zeros(8, 1, dtype=torch.long)).item() == pytest.approx(4.0)
    assert S.expert_capacity(100, 8, 2, 1.0) == 25 and S.expert_capacity(100, 8, 2, None) == 100
    with pytest.raises(ValueError, match="k must be at most"):
        S.TopKRouter(8, 2, 3)
    with pytest.raises(ValueError, match="capacity_factor"):
        S.expert_capacity(10, 2, 1, 0)


def test_moe_flops_and_training():
    assert S.moe_flops_per_token(64, 128, 8, 2) == 2 * 64 * 8 + 2 * 6 * 64 * 128
    dense_same_params = S.dense_flops_per_token(64, 8 * 128)
    assert S.moe_flops_per_token(64, 128, 8, 2) < dense_same_params / 3.5
    h = S.train_moe_demo(steps=15, batch=32)
    assert h["load"].shape == (15, 8) and torch.allclose(h["load"].sum(1), torch.ones(15))
    assert sum(h["loss"][-5:]) < sum(h["loss"][:5])


# --- sparse attention ------------------------------------------------------------------------------------
def test_attention_patterns():
    T = 20
    w = S.sliding_window_mask(T, 4)
    assert int(w.sum(1).max()) == 4 and w[10, 7] and not w[10, 6] and not w[3, 4]
    g = S.global_mask(T, 2)
    assert g[:, 0].all() and g[15, 1] and not g[15, 5] and g[15, 15]
    r = S.random_blocks_mask(T, 4, 1, seed=0)
    assert torch.equal(r, S.random_blocks_mask(T, 4, 1, seed=0))
    for m in (w, g, r, S.bigbird_mask(T, 4, 2, 4, 1)):
        assert not torch.triu(m, 1).any() and m.diagonal().all()
    c = S.pattern_cost(w, 16)
    assert c["pairs"] == sum(min(i + 1, 4) for i in range(T)) and c["dense_pairs"] == T * (T + 1) // 2
    assert c["flops"] == 64 * c["pairs"]


def test_masked_attention_model_full_window_equals_model():
    m = small_model()
    x = ids(2, 16)
    full = S.MaskedAttentionModel(m, lambda T, d: S.sliding_window_mask(T, T, d))
    short = S.MaskedAttentionModel(m, lambda T, d: S.sliding_window_mask(T, 2, d))
    with torch.no_grad():
        torch.testing.assert_close(full(x), m(x), rtol=1e-5, atol=1e-5)
        assert not torch.allclose(short(x), m(x), atol=1e-3)
        torch.testing.assert_close(short(x)[:, :2], m(x)[:, :2], rtol=1e-5, atol=1e-5)
