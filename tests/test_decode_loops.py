"""One decode loop: every draft (a draft model, prompt lookup, Medusa's tree, any draft object) runs through
``generate``, which verifies it; the output equals greedy decoding token for token, and the context rule
is generate's for all of them. Also generate's batches with per-row settings (the static serving baseline).

Fresh random prompts every run (the seed is in the failure message); CPU float32, where a tree forward and
a plain forward pick the same argmax on these models (random weights scaled up: no near-ties)."""
from __future__ import annotations

import pytest
import torch

from course_lib.generation import TokenTree, generate
from course_lib.models.config import LlamaConfig
from course_lib.models.llama import LlamaForCausalLM
from course_lib.speculative.medusa import MedusaDraft, MedusaHeads, medusa_generate
from course_lib.speculative.prompt_lookup import PromptLookupDraft, prompt_lookup_generate
from course_lib.speculative.loop import speculative_generate
from course_lib.speculative.tree import cartesian_paths, chain_paths

V, CTX = 61, 40


def tiny(seed: int, layers: int = 2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                                     num_attention_heads=4, num_key_value_heads=2,
                                     max_position_embeddings=CTX)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(3.0)                  # peaky logits: the greedy choice is never a near-tie
    return m


@pytest.fixture(scope="module")
def target():
    return tiny(0)


@pytest.fixture(scope="module")
def heads():
    torch.manual_seed(3)
    h = MedusaHeads(32, V, num_heads=3)
    for b in h.blocks:
        torch.nn.init.normal_(b.linear.weight, std=0.3)
    return h.eval()


def greedy(model, prompt, n, **kw):
    return generate(model, prompt, n, cache="contiguous", **kw).tokens


class Oracle:
    """A draft object that knows the greedy continuation and proposes it with every `wrong`-th token
    changed: generate must keep exactly the right prefix (chains) or the right path (trees)."""

    def __init__(self, truth: torch.Tensor, prompt_len: int, wrong: int, tree: bool):
        self.truth, self.T, self.wrong, self.tree, self.calls = truth.tolist(), prompt_len, wrong, tree, 0

    def propose(self, seq, budget, hidden):
        self.calls += 1
        done = seq.numel() - self.T                          # tokens kept so far
        right = self.truth[done:done + budget]
        bad = [(t + 1) % V if (self.calls + i) % self.wrong == 0 else t for i, t in enumerate(right)]
        if not self.tree:
            return torch.tensor(bad, dtype=torch.long)
        # root, then the corrupted chain and the right chain as two branches (siblings differ or merge)
        tokens, parents = [int(seq[-1])], [-1]
        for branch in (bad, right):
            prev = 0
            for t in branch:
                tokens.append(t)
                parents.append(prev)
                prev = len(tokens) - 1
        return TokenTree(torch.tensor(tokens), parents)


def random_prompt(gen, T):
    """T random ids whose first third repeats (so prompt lookup finds n-grams)."""
    base = torch.randint(0, V, (max(T // 3, 1),), generator=gen)
    return torch.cat([base, base, torch.randint(0, V, (T - 2 * base.numel(),), generator=gen)])[:T]


def test_every_draft_through_generate_equals_greedy(target, heads):
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    draft_model = tiny(1, layers=1)
    for trial in range(3):
        T = int(torch.randint(3, 15, (1,), generator=gen))
        n = CTX - T + 1 - int(torch.randint(0, 4, (1,), generator=gen))          # up to the context limit
        prompt = random_prompt(gen, T)
        want = greedy(target, prompt, n)
        drafts = {"draft model": (draft_model, 3), "prompt lookup": (PromptLookupDraft(3), 5),
                  "oracle chain": (Oracle(want, T, 3, tree=False), 4),
                  "oracle tree": (Oracle(want, T, 2, tree=True), 3)}
        for paths in (None, [], cartesian_paths((2, 2)), chain_paths(3)):
            drafts[f"medusa {paths}"] = (MedusaDraft(target, heads, tree=paths), 3)
        for name, (d, g) in drafts.items():
            out = generate(target, prompt, n, draft=d, draft_length=g)
            assert torch.equal(out.tokens, want), f"{name}, seed {seed}, trial {trial}"
            assert out.stats.emitted == n and out.stats.passes <= n
            if name.startswith("oracle"):             # accepted tokens and rejections both happened
                assert 0 < out.stats.accepted and out.stats.passes < n, (name, out.stats)
                assert out.stats.rejections > 0, (name, out.stats)
        # a stop token cuts every draft's output where greedy decoding stops
        eos = int(want[n // 2])
        want_eos = greedy(target, prompt, n, eos_token_id=eos)
        for name, (d, g) in list(drafts.items())[:2] + list(drafts.items())[4:5]:
            got = generate(target, prompt, n, draft=d, draft_length=g, eos_token_id=eos).tokens
            assert torch.equal(got, want_eos), f"{name} with eos, seed {seed}"


def test_context_boundary_is_generates_for_every_draft(target, heads):
    """prompt + max_new_tokens - 1 <= context for plain decoding and every draft: at the limit it runs
    (and equals greedy), one past it is a ValueError naming the context."""
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    draft_model = tiny(1, layers=1)
    T = 10
    prompt = random_prompt(gen, T)
    at_limit, past = CTX - T + 1, CTX - T + 2
    want = greedy(target, prompt, at_limit)
    runs = {
        "plain": lambda n: generate(target, prompt, n, cache="contiguous").tokens,
        "no cache": lambda n: generate(target, prompt, n).tokens,
        "draft model": lambda n: generate(target, prompt, n, draft=draft_model).tokens,
        "speculative_generate": lambda n: speculative_generate(target, draft_model, prompt, n)[0][0, T:],
        "prompt lookup": lambda n: generate(target, prompt, n, draft=PromptLookupDraft(), draft_length=6).tokens,
        "prompt_lookup_generate": lambda n: prompt_lookup_generate(target, prompt, n)[0][0, T:],
        "medusa": lambda n: generate(target, prompt, n, draft=MedusaDraft(target, heads), draft_length=2).tokens,
        "medusa_generate": lambda n: medusa_generate(target, heads, prompt, n)[0][0, T:],
    }
    for name, run in runs.items():
        assert torch.equal(run(at_limit), want), name
        with pytest.raises(ValueError, match="context of 40"):
            run(past)


def test_draft_objects_are_checked(target):
    prompt = torch.arange(1, 9)
    with pytest.raises(ValueError, match="temperature"):
        generate(target, prompt, 4, draft=PromptLookupDraft(), temperature=0.7)
    with pytest.raises(ValueError, match="adaptive"):
        generate(target, prompt, 4, draft=PromptLookupDraft(), adaptive=0.5)

    class TooLong:
        def propose(self, seq, budget, hidden):
            return seq[:budget + 1]

    class WrongRoot:
        def propose(self, seq, budget, hidden):
            return TokenTree(torch.tensor([int(seq[-1]) + 1]), [-1])

    with pytest.raises(ValueError, match="at most 2 tokens"):
        generate(target, prompt, 6, draft=TooLong(), draft_length=2)
    with pytest.raises(ValueError, match="rooted at the pending token"):
        generate(target, prompt, 6, draft=WrongRoot())


def test_batch_of_different_prompts_with_per_row_settings_equals_each_alone(target):
    """Left-padded prompts of different lengths, each row with its own max_new_tokens, stop tokens,
    sampling settings and generator: every row equals that request decoded alone."""
    seed = torch.seed() % 2**31
    gen = torch.Generator().manual_seed(seed)
    lens = [int(torch.randint(1, 12, (1,), generator=gen)) for _ in range(4)]
    prompts = [torch.randint(0, V, (n,), generator=gen).tolist() for n in lens]
    limits = [int(torch.randint(1, 12, (1,), generator=gen)) for _ in prompts]
    temps, ks, ps, seeds = [0.0, 0.9, 0.0, 1.3], [None, 20, None, None], [None, None, None, 0.9], [None, 11, None, 12]

    def gens():
        return [torch.Generator().manual_seed(s) if s is not None else None for s in seeds]

    alone = [generate(target, p, n, temperature=t, top_k=k, top_p=tp, generator=g, cache="contiguous").tokens.tolist()
             for p, n, t, k, tp, g in zip(prompts, limits, temps, ks, ps, gens())]
    stops = [[alone[0][len(alone[0]) // 2]], [], None, [alone[3][0]]]
    want = [a[:next((i + 1 for i, t in enumerate(a) if t in (s or [])), len(a))] for a, s in zip(alone, stops)]
    out = generate(target, prompts, limits, temperature=temps, top_k=ks, top_p=ps, eos_token_id=stops,
                   cache="contiguous", generator=gens())
    assert out.tokens.shape[0] == 4 and out.tokens.shape[1] == max(len(w) for w in want)
    for r, w in enumerate(want):
        row = out.tokens[r].tolist()
        assert row[:len(w)] == w, f"row {r}, seed {seed}"
        assert all(t == w[-1] for t in row[len(w):]), f"row {r} repeats its last token once it ended"
    with pytest.raises(ValueError, match="cache='contiguous'"):
        generate(target, [[1, 2, 3], [4]], 3)
    with pytest.raises(ValueError, match="max_new_tokens: got 3 values for a batch of 2"):
        generate(target, [[1, 2, 3], [4]], [3, 3, 3], cache="contiguous")
    with pytest.raises(ValueError, match="one request"):
        generate(target, [[1, 2, 3]], [3], draft=PromptLookupDraft())
