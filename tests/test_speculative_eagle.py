"""EAGLE's draft head and DeepSeek-V3's MTP modules (course_lib.speculative.eagle), through the one generate loop.

What is checked: greedy exactness on fresh random prompts (whatever the heads say); that the drafts' cached,
incremental proposals equal a from-scratch computation of the papers' equations at every pass (the caching is
where such drafts go wrong); the block against transformers' LlamaDecoderLayer; training lowers the loss;
saving and loading; the loop's contract for needs_hidden='all'; the bundled heads beat untrained ones.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from course_lib.generation import TokenTree, generate
from course_lib.speculative.eagle import (EagleDraft, EagleHead, MTPDraft, MTPHeads,
                                          feature_head_accuracy, load_feature_heads, save_feature_heads,
                                          train_feature_heads)


@pytest.fixture(scope="module")
def target_tok():
    from course_lib.models import load
    return load("tiny", device="cpu", verbose=False)


def _random_heads(cls, target, seed, **kw):
    torch.manual_seed(seed)
    heads = cls(target.config, **kw)
    with torch.no_grad():                      # large enough that the heads' argmax is not the target's
        for p in heads.parameters():
            if p.dim() == 2:
                p.normal_(0, 0.05)
    return heads.eval()


class Recorder:
    """Wraps a draft: records (seq, proposals) at every pass (the loop sees the same draft)."""

    def __init__(self, draft):
        self.draft, self.calls = draft, []
        self.needs_hidden = draft.needs_hidden

    def reset(self):
        self.draft.reset()

    def propose(self, seq, budget, hidden=None):
        out = self.draft.propose(seq, budget, hidden)
        self.calls.append((seq.clone(), budget, out.clone()))
        return out


@torch.no_grad()
def _eagle_from_scratch(target, head, seq, g):
    """EAGLE's equations with no cache: every step runs the layer over all pairs from position 0."""
    n = seq.numel()
    if n < 2 or g == 0:
        return []
    feats = target(seq[None, :n - 1], return_hidden=True)[1][0]                  # f_0..f_{n-2}
    toks = seq.tolist()
    emb = target.model.embed_tokens
    out = []
    for _ in range(g):
        e = emb(torch.tensor(toks[1:], dtype=torch.long))                        # e(t_1)..e(t_last)
        h = head.layer(feats[None], e[None])[0, -1]                              # f^ after the last token
        tok = int(target.lm_head(h).argmax())
        out.append(tok)
        feats = torch.cat([feats, h[None]])                                      # the predicted feature
        toks.append(tok)
    return out


@torch.no_grad()
def _mtp_from_scratch(target, heads, seq, g):
    """DeepSeek-V3's MTP equations with no cache: module k over rows 0..n-2 of module k-1's output."""
    n = seq.numel()
    if n < 2 or g == 0:
        return []
    h = target(seq[None, :n - 1], return_hidden=True)[1][0]                      # h^0 rows 0..n-2
    ext, emb, out = seq.tolist(), target.model.embed_tokens, []
    for k, block in enumerate(heads.blocks[:g], start=1):
        e = emb(torch.tensor(ext[k:n - 1 + k], dtype=torch.long))                # t_{i+k}, rows 0..n-2
        h = block(h[None], e[None])[0]
        tok = int(target.lm_head(h[-1]).argmax())
        out.append(tok)
        ext.append(tok)
    return out


@pytest.mark.parametrize("heads_from", ["random", "bundled"])
@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_cached_proposals_equal_the_equations_and_output_is_greedy(target_tok, kind, heads_from):
    """Random heads are rejected at once; the bundled ones get proposals accepted, so the cache rows built on
    drafted tokens that were then kept are exercised too. Prompts: fresh random tokens, or held-out text."""
    target, tok = target_tok
    gen = torch.Generator(device="cpu").manual_seed(1234 + (kind == "mtp") + 10 * (heads_from == "bundled"))
    if heads_from == "bundled":
        heads = load_feature_heads(kind)
    elif kind == "eagle":
        heads = _random_heads(EagleHead, target, 5)
    else:
        heads = _random_heads(MTPHeads, target, 6, num_modules=3)
    Draft, scratch = (EagleDraft, _eagle_from_scratch) if kind == "eagle" else (MTPDraft, _mtp_from_scratch)
    if heads_from == "bundled":
        from course_lib.models.corpus import load_split
        text = tok.encode(load_split("heldout", max_files=3)[2][:4000])
    accepted = 0
    for trial in range(3):
        T = int(torch.randint(1, 30, (1,), generator=gen))
        if heads_from == "bundled":
            start = int(torch.randint(0, len(text) - T, (1,), generator=gen))
            prompt = torch.tensor(text[start:start + T])
        else:
            prompt = torch.randint(1, target.config.vocab_size, (T,), generator=gen)
        g = int(torch.randint(1, 6, (1,), generator=gen))
        ref = generate(target, prompt, 25, cache="contiguous").tokens
        rec = Recorder(Draft(target, heads))
        out = generate(target, prompt, 25, draft=rec, draft_length=g)
        assert torch.equal(out.tokens, ref), f"{kind}: the output must be the target's greedy tokens (T={T}, g={g})"
        assert len(rec.calls) == out.stats.passes
        for seq, budget, proposed in rec.calls:
            want = scratch(target, heads, seq, budget)
            assert proposed.tolist() == want, f"{kind}: pass at n={seq.numel()}: cached {proposed.tolist()} != {want}"
        if kind == "mtp":
            assert max(out.stats.per_pass_drafted) <= len(heads.blocks), "MTP proposes at most one token per module"
        accepted += out.stats.accepted
    if heads_from == "bundled":
        assert accepted > 5, f"{kind}: the bundled heads should get proposals accepted ({accepted})"


def test_draft_reused_across_calls_is_reset(target_tok):
    target, _ = target_tok
    heads = _random_heads(EagleHead, target, 7)
    draft = EagleDraft(target, heads)
    for prompt in (torch.tensor([3, 4, 5, 6]), torch.tensor([9]), torch.tensor([1, 2])):
        ref = generate(target, prompt, 12, cache="contiguous").tokens
        assert torch.equal(generate(target, prompt, 12, draft=draft, draft_length=3).tokens, ref)


def test_feature_layer_block_is_transformers_llama_decoder_layer(target_tok):
    """The block after the fusion is a Llama decoder layer: transformers' own, with the same weights, agrees."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
    target, _ = target_tok
    torch.manual_seed(0)
    layer = _random_heads(EagleHead, target, 8).layer
    hf_cfg = transformers.LlamaConfig(**{k: v for k, v in target.config.to_hf().items() if k != "architectures"})
    hf_cfg.num_hidden_layers = 1
    hf_cfg._attn_implementation = "eager"
    hf = LlamaDecoderLayer(hf_cfg, 0).eval()
    hf.load_state_dict(layer.layer.state_dict())
    f, e = torch.randn(2, 9, 256), torch.randn(2, 9, 256)
    x = F.linear(torch.cat([e, f], -1), layer.fc.weight, layer.fc.bias)             # EAGLE's fc([e; f])
    pos = torch.arange(9)[None].expand(2, 9)
    cos, sin = LlamaRotaryEmbedding(hf_cfg)(x, pos)
    mask = torch.full((9, 9), float("-inf")).triu(1)[None, None].expand(2, 1, 9, 9)
    out = hf(x, attention_mask=mask, position_ids=pos, position_embeddings=(cos, sin))
    out = out[0] if isinstance(out, tuple) else out
    torch.testing.assert_close(layer(f, e), out, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_training_lowers_the_loss_and_round_trips(target_tok, tmp_path, kind):
    target, tok = target_tok
    from course_lib.models.corpus import load_split
    texts = load_split("train", max_files=3)
    heads = EagleHead(target.config) if kind == "eagle" else MTPHeads(target.config, 2)
    heads, hist = train_feature_heads(target, heads, texts, tok, steps=40, seq_len=64, batch_size=4, lr=3e-3,
                                      max_tokens=4096, progress=False)
    first, last = sum(hist["loss"][:5]) / 5, sum(hist["loss"][-5:]) / 5
    assert last < 0.8 * first, f"{kind}: loss {first:.3f} -> {last:.3f}"
    assert not any(p.requires_grad for p in target.parameters()), "the target stays frozen"
    save_feature_heads(heads, tmp_path / kind, extra={"note": "test"})
    back = load_feature_heads(kind, path=tmp_path / kind)
    assert type(back) is type(heads) and back.info["note"] == "test"
    for (name, a), (_, b) in zip(heads.state_dict().items(), back.state_dict().items()):
        torch.testing.assert_close(b, a.half().float(), msg=name)                   # fp16 on disk
    with pytest.raises(ValueError, match="holds"):
        load_feature_heads("mtp" if kind == "eagle" else "eagle", path=tmp_path / kind)


def test_errors_name_what_was_expected(target_tok, tmp_path):
    target, _ = target_tok
    with pytest.raises(FileNotFoundError, match="python -m course_lib.speculative.eagle --kind eagle"):
        load_feature_heads("eagle", path=tmp_path)
    with pytest.raises(ValueError, match="kind must be"):
        load_feature_heads("medusa")
    with pytest.raises(TypeError, match="MTPHeads"):
        MTPDraft(target, EagleHead(target.config))
    with pytest.raises(ValueError, match="num_modules"):
        MTPHeads(target.config, 0)
    with pytest.raises(RuntimeError, match="generate"):
        EagleDraft(target, EagleHead(target.config)).propose(torch.tensor([1, 2, 3]), 2)

    class TreeFromAll:                                   # needs every hidden state, proposes a tree: refused
        needs_hidden = "all"

        def propose(self, seq, budget, hidden=None):
            return TokenTree(tokens=torch.tensor([int(seq[-1]), 5]), parents=[-1, 0])

    with pytest.raises(ValueError, match="chains"):
        generate(target, torch.tensor([1, 2, 3]), 4, draft=TreeFromAll(), draft_length=2)

    class Odd:
        needs_hidden = "some"

        def propose(self, seq, budget, hidden=None):
            return seq[:0]

    with pytest.raises(ValueError, match="needs_hidden"):
        generate(target, torch.tensor([1, 2, 3]), 4, draft=Odd(), draft_length=2)


@pytest.mark.parametrize("kind", ["eagle", "mtp"])
def test_bundled_heads_agree_with_the_target_and_get_accepted(target_tok, kind):
    target, tok = target_tok
    from course_lib.models.corpus import load_split
    heads = load_feature_heads(kind)
    held = load_split("heldout", max_files=2)
    acc = feature_head_accuracy(target, heads, held, tok, max_tokens=2048)["agree"]
    blank = feature_head_accuracy(target, EagleHead(target.config) if kind == "eagle" else MTPHeads(
        target.config, len(heads.blocks)), held, tok, max_tokens=2048)["agree"]
    assert acc[0] > 0.5 and acc[0] > blank[0] + 0.2, (acc, blank)
    prompt = torch.tensor(tok.encode("def fibonacci(n):\n    if n < 2:\n        return n\n"))
    Draft = EagleDraft if kind == "eagle" else MTPDraft
    out = generate(target, prompt, 40, draft=Draft(target, heads), draft_length=3)
    assert torch.equal(out.tokens, generate(target, prompt, 40, cache="contiguous").tokens)
    assert out.stats.accepted / out.stats.drafted > 0.3, out.stats
