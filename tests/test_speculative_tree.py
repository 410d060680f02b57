"""Module 08: tree attention is exact, tree verification keeps the right path and cache, Medusa == greedy."""
import pytest
import torch

from course_lib.generation import generate
from course_lib.kvcache import ContiguousCache, StaticCache
from course_lib.models import LlamaConfig, LlamaForCausalLM, load
from course_lib.models.corpus import load_split
from course_lib.speculative import medusa as medusa_mod
from course_lib.speculative.medusa import (MedusaHeads, load_medusa_heads, medusa_accuracy, medusa_generate,
                                           save_medusa_heads, train_medusa)
from course_lib.speculative.tree import (TokenTree, build_tree, cartesian_paths, chain_paths, tree_attention_mask,
                                         tree_positions, verify_tree)
from device_tools import assert_greedy_match, tol_for


def greedy_ids(model, prompt, n, **kw):
    """Plain cached greedy decoding (the one generate loop): ids [1, T + n] with the prompt, on its device."""
    out = generate(model, prompt, n, cache="contiguous", **kw)
    return torch.cat([prompt, out.tokens.to(prompt.device)[None]], dim=1)


@pytest.fixture(scope="module")
def target(device):
    m, tok = load("tiny", device=device)
    return m, tok


@pytest.fixture(scope="module")
def heldout_prompts(target):
    _, tok = target
    texts = load_split("heldout", max_files=3)
    prompts = []
    for i, text in enumerate(texts):
        ids = tok(text, verbose=False)["input_ids"]
        start = 200 * (i + 1) % max(len(ids) - 64, 1)
        prompts.append(torch.tensor([ids[start:start + 48]], device=target[0].device))
    return prompts


@pytest.fixture(scope="module")
def tiny_random(device):
    torch.manual_seed(1)
    cfg = LlamaConfig(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
    return LlamaForCausalLM(cfg).eval().to(device)   # initialised on the CPU: the same weights everywhere


def random_parents(n, gen):
    return [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, n)]


def ancestors(parents, i):
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


# ---------------------------------------------------------------------------------------------- tree
def test_tree_mask_and_positions_match_brute_force():
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    for n in (1, 2, 5, 9, 17):
        parents = random_parents(n, gen)
        past = int(torch.randint(0, 7, (1,), generator=gen))
        mask = tree_attention_mask(parents, past)
        want = torch.zeros(n, past + n, dtype=torch.bool)
        want[:, :past] = True
        for i in range(n):
            for j in ancestors(parents, i):
                want[i, past + j] = True
        assert torch.equal(mask, want), (parents, past)
        depth = [len(ancestors(parents, i)) - 1 for i in range(n)]
        assert tree_positions(parents, past).tolist() == [past + d for d in depth]
    # a chain is the ordinary causal mask
    assert torch.equal(tree_attention_mask([-1, 0, 1, 2]), torch.tril(torch.ones(4, 4, dtype=torch.bool)))


def test_build_tree_from_medusa_paths():
    cands = [torch.tensor([10, 11]), torch.tensor([20, 21]), torch.tensor([30])]
    paths = [(0, 0, 0), (1,), (0, 1), (0,), (1, 0), (0, 0)]  # any order; sorted parents-first
    tree = build_tree(cands, paths, root=5)
    assert tree.paths == [(0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0)]
    assert tree.tokens.tolist() == [5, 10, 11, 20, 21, 20, 30]
    assert tree.parents == [-1, 0, 0, 1, 1, 2, 3]
    assert tree.depths == [0, 1, 1, 2, 2, 2, 3]
    assert tree.path_to(6) == [0, 1, 3, 6]
    assert build_tree(cands, [], root=5).size == 1
    assert len(cartesian_paths((2, 2))) == 6 and len(cartesian_paths((3, 2, 1))) == 3 + 6 + 6
    assert chain_paths(3) == [(0,), (0, 0), (0, 0, 0)]


@pytest.mark.parametrize("which", ["bundled", "random"])
def test_tree_forward_equals_plain_forward_of_each_path(which, target, tiny_random, device):
    """The exactness of tree attention: node i's logits == last logits of a plain forward of prefix + path(i)."""
    model = target[0] if which == "bundled" else tiny_random
    V = model.config.vocab_size
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    prefix = torch.randint(1, V, (1, 11), generator=gen).to(device)
    tree = TokenTree(torch.randint(1, V, (10,), generator=gen).to(device), random_parents(10, gen))
    cache = ContiguousCache()
    with torch.no_grad():
        model(prefix, cache=cache)
        res = verify_tree(model, cache, tree, compact=False)
        assert cache.get_seq_length() == 11 + 10
        for i in range(tree.size):
            seq = torch.cat([prefix[0], tree.tokens[tree.path_to(i)]])[None]
            want = model(seq)[0, -1]
            torch.testing.assert_close(res.logits[i], want, **tol_for(device, dict(rtol=1e-4, atol=1e-4)))


@pytest.mark.parametrize("cache_kind", ["contiguous", "static"])
@pytest.mark.parametrize("break_at", [None, 2])
def test_verify_keeps_greedy_path_and_cache_equals_recompute(target, cache_kind, break_at, device):
    model = target[0]
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    prefix = torch.randint(1, 2048, (1, 13), generator=gen).to(device)
    greedy = generate(model, prefix, 5, cache="contiguous").tokens.tolist()  # g0..g4; g0 is the root

    def decoy(avoid):
        while True:
            t = int(torch.randint(1, 2048, (1,), generator=gen))
            if t not in avoid:
                return t
    # depth 1: [decoy, g1]; depth 2 under g1: [decoy, g2 (or a decoy)]; depth 3: g3; plus a decoy subtree
    planted = [greedy[1], greedy[2] if break_at != 2 else decoy(greedy), greedy[3]]
    d1 = decoy(greedy)
    tokens = [greedy[0], d1, planted[0], decoy(greedy), planted[1], decoy(greedy), planted[2]]
    parents = [-1, 0, 0, 1, 2, 2, 4]
    tree = TokenTree(torch.tensor(tokens), parents)
    cache = ContiguousCache() if cache_kind == "contiguous" else StaticCache(64)
    with torch.no_grad():
        model(prefix, cache=cache)
        res = verify_tree(model, cache, tree)
    if break_at is None:
        assert res.path == [0, 2, 4, 6] and res.tokens == greedy[1:4] and res.next_token == greedy[4]
    else:
        assert res.path == [0, 2] and res.tokens == [greedy[1]] and res.next_token == greedy[2]
    # the compacted cache is what a plain forward of prefix + root + accepted tokens writes
    fresh = ContiguousCache()
    seq = torch.cat([prefix[0], torch.tensor([greedy[0], *res.tokens], device=device)])[None]
    with torch.no_grad():
        model(seq, cache=fresh)
    assert cache.get_seq_length() == seq.shape[1]
    for layer in range(model.config.num_hidden_layers):
        n = seq.shape[1]
        tol = tol_for(device, dict(rtol=1e-5, atol=1e-5))
        torch.testing.assert_close(cache.k[layer][:, :, :n], fresh.k[layer], **tol)
        torch.testing.assert_close(cache.v[layer][:, :, :n], fresh.v[layer], **tol)


def test_compact_cache_index_select():
    c = ContiguousCache()
    k, v = torch.randn(1, 2, 6, 4), torch.randn(1, 2, 6, 4)
    c.update(k, v, 0)
    c.compact(torch.tensor([0, 1, 4]))
    assert torch.equal(c.k[0], k[:, :, [0, 1, 4]]) and torch.equal(c.v[0], v[:, :, [0, 1, 4]])
    with pytest.raises(ValueError, match="keep"):
        c.compact(torch.tensor([2, 1]))


# -------------------------------------------------------------------------------------------- medusa
def test_heads_start_as_the_next_token_head_and_shapes(target, device):
    model = target[0]
    heads = MedusaHeads(256, 2048, num_heads=3, device=device)
    assert heads.device == model.device
    h = torch.randn(2, 5, 256, device=device)
    with torch.no_grad():
        out = heads(h, model.lm_head)
        assert out.shape == (2, 5, 3, 2048)
        for k in range(3):  # zero-initialized residual block: head k == lm_head at first
            torch.testing.assert_close(out[:, :, k], model.lm_head(h))
        own = MedusaHeads(256, 2048, num_heads=2, share_lm_head=False, device=device)
        assert own(h).shape == (2, 5, 2, 2048)
    # sharing keeps a head to D*D + D parameters
    assert sum(p.numel() for p in heads.parameters()) == 3 * (256 * 256 + 256)


def test_train_medusa_learns(target):
    model, tok = target
    texts = load_split("train", max_files=2)
    heads, hist = train_medusa(model, texts, tok, steps=40, num_heads=2, seq_len=128, batch_size=4, lr=3e-3,
                               max_tokens=128 * 24, progress=False)
    first, last = sum(hist["loss"][:5]) / 5, sum(hist["loss"][-5:]) / 5
    assert last < first - 0.5, (first, last)
    assert all(not p.requires_grad for p in model.parameters())  # the target stayed frozen
    assert heads.device == model.device                          # trained where the target is
    fresh = MedusaHeads(256, 2048, num_heads=2, device=model.device)
    acc_fresh = medusa_accuracy(model, fresh, texts, tok, seq_len=128, max_tokens=128 * 24)["heads"][0]
    acc = medusa_accuracy(model, heads, texts, tok, seq_len=128, max_tokens=128 * 24)["heads"][0]
    assert acc > acc_fresh + 0.05, (acc_fresh, acc)


def test_bundled_heads_are_trained(target):
    model, tok = target
    heads = load_medusa_heads("tiny", device=model.device)
    assert heads.num_heads >= 3 and heads.hidden_size == 256 and heads.device == model.device
    acc = medusa_accuracy(model, heads, load_split("heldout", max_files=1), tok, max_tokens=256 * 6)
    fresh = medusa_accuracy(model, MedusaHeads(256, 2048, heads.num_heads, device=model.device),
                            load_split("heldout", max_files=1), tok, max_tokens=256 * 6)
    # trained head 0 (two tokens ahead) beats the untrained guess (the next-token head) by a wide margin
    assert acc["heads"][0] > fresh["heads"][0] + 0.1, (acc, fresh)
    assert acc["heads"][0] > acc["heads"][-1]  # further ahead is harder


def test_medusa_generate_equals_greedy_bundled(target, heldout_prompts, device):
    model, _ = target
    heads = load_medusa_heads("tiny", device=device)
    per_pass = []
    for prompt in heldout_prompts[:2]:
        out = generate(model, prompt, 40, cache="contiguous", return_logits=True)
        want, want_logits = out.tokens.to(device), out.logits        # [40], [40, V]
        T = prompt.shape[1]
        for kw in ({}, {"topk": 1}, {"tree": cartesian_paths((2, 2))}):
            got, stats = medusa_generate(model, heads, prompt, 40, **kw)
            assert got.device == prompt.device and torch.equal(got[:, :T], prompt)
            # CPU: token for token; CUDA (tree attention runs other kernels): up to a near-tie, see device_tools
            assert_greedy_match(got[0, T:], want, want_logits, device, what=str(kw))
            assert stats.emitted == 40 and sum(a + 1 for a in stats.accepted) + 1 >= 40
            per_pass.append(stats.tokens_per_pass)
    # trained heads do get tokens accepted (about 1.15 per pass here; untrained heads give about 1.0)
    assert sum(per_pass) / len(per_pass) > 1.08, per_pass


def test_medusa_generate_exact_with_random_model_and_heads(tiny_random, device):
    torch.manual_seed(torch.seed() % 2**31)
    heads = MedusaHeads(32, 97, num_heads=3)
    for b in heads.blocks:
        torch.nn.init.normal_(b.linear.weight, std=0.3)
    heads.to(device)
    prompt = torch.randint(1, 97, (1, 9)).to(device)
    want = greedy_ids(tiny_random, prompt, 30)
    for kw in ({}, {"tree": []}, {"topk": 2}, {"topk": (3, 1)}, {"tree": chain_paths(3)}):
        got, stats = medusa_generate(tiny_random, heads, prompt, 30, **kw)
        assert torch.equal(got, want), kw
        assert len(stats.head_acceptance) == 3 and stats.passes == len(stats.accepted)
    # eos: stops right after the first eos, as generate does
    eos = int(want[0, 9 + 7])
    want_eos = greedy_ids(tiny_random, prompt, 30, eos_token_id=eos)
    got_eos, _ = medusa_generate(tiny_random, heads, prompt, 30, eos_token_id=eos)
    assert torch.equal(got_eos, want_eos)
    got0, _ = medusa_generate(tiny_random, heads, prompt, 0)
    assert torch.equal(got0, prompt)


def test_save_load_round_trip_and_missing_folder(tmp_path, monkeypatch, target, device):
    heads = MedusaHeads(256, 2048, num_heads=2, device=device)
    torch.nn.init.normal_(heads.blocks[1].linear.weight)
    save_medusa_heads(heads, tmp_path / "x")
    back = load_medusa_heads(path=tmp_path / "x", device=device)
    assert back.device == heads.device
    h = torch.randn(3, 256, device=device)
    with torch.no_grad():
        torch.testing.assert_close(back(h, target[0].lm_head), heads(h, target[0].lm_head))
    monkeypatch.setattr(medusa_mod, "BUNDLED_HEADS_ROOT", tmp_path)
    with pytest.raises(FileNotFoundError, match="model_name='tiny'"):
        load_medusa_heads("tiny")


# --------------------------------------------------------------------------------------------- input
def test_bad_input(target, tiny_random, device):
    model = target[0]
    with pytest.raises(ValueError, match="empty"):
        TokenTree(torch.tensor([], dtype=torch.long), [])
    with pytest.raises(ValueError, match=r"parents\[2\]"):
        TokenTree(torch.tensor([1, 2, 3]), [-1, 0, 2])
    with pytest.raises(ValueError, match=r"parents\[0\]"):
        tree_attention_mask([0, 0])
    with pytest.raises(ValueError, match="prefix-closed"):
        build_tree([[1, 2], [3, 4]], [(0, 1)], root=0)
    with pytest.raises(ValueError, match="candidates_per_depth"):
        build_tree([[1, 2]], [(2,)], root=0)
    prompt = torch.tensor([[1, 2, 3]], device=device)
    with pytest.raises(ValueError, match="heads: hidden_size=128"):
        medusa_generate(model, MedusaHeads(128, 2048), prompt, 5)
    with pytest.raises(ValueError, match="tree: depth 3"):
        medusa_generate(model, MedusaHeads(256, 2048, num_heads=2, device=device), prompt, 5, tree=chain_paths(3))
    with pytest.raises(ValueError, match="either tree"):
        medusa_generate(model, MedusaHeads(256, 2048, device=device), prompt, 5, tree=[(0,)], topk=2)
    # heads on another device than the target: a clear error, not a kernel's device mismatch ("meta" is a
    # second device on every machine)
    elsewhere = MedusaHeads(256, 2048, device="meta")
    with pytest.raises(ValueError, match="device=target.device"):
        medusa_generate(model, elsewhere, prompt, 5)
    with pytest.raises(ValueError, match="device=target.device"):
        medusa_accuracy(model, elsewhere, ["x = 1\n" * 40], target[1], seq_len=16)
    with pytest.raises(ValueError, match="batch size 1"):
        cache = ContiguousCache()
        with torch.no_grad():
            tiny_random(torch.tensor([[1, 2], [3, 4]], device=device), cache=cache)
        verify_tree(tiny_random, cache, TokenTree(torch.tensor([5]), [-1]))
    with pytest.raises(ValueError, match="hidden_size"):
        train_medusa(model, ["x = 1"], target[1], steps=1, heads=MedusaHeads(64, 2048))
