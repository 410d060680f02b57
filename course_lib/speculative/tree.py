"""Tree verification: check many candidate continuations in ONE target forward (SpecInfer, Medusa).

A chain draft (Module 08's draft-then-verify) bets on one continuation; when its first token is wrong,
the whole pass yields one token. A tree hedges: at each depth it keeps a few candidates, so a miss on
the favourite can still be saved by the runner-up. All nodes of the tree go through the target in one
forward; the trick that makes this exact is the *tree attention mask*.

Notation (shapes): N tree nodes, S_past tokens already in the KV cache, V vocabulary, D hidden size.

The tree. Node 0 is the root: the last token already decided (the target's own greedy pick, emitted but
not yet in the cache). Every other node i holds a candidate token and the index ``parents[i] < i`` of the
node it follows, so the path root -> ... -> i is one candidate continuation. Medusa describes its trees
by *paths* of top-k choices, one index per depth: ``(0,)`` is the top-1 candidate at depth 1, ``(1,)``
the top-2, ``(0, 1)`` the top-2 candidate at depth 2 placed after the top-1 at depth 1, and so on
(``build_tree``). A list of paths must be prefix-closed: ``(0, 1)`` needs ``(0,)``.

Why one forward is exact. Node i must see exactly what it would see in a plain forward of
``past + path(i)``: all past tokens, its ancestors, itself, and nothing else (not its siblings, not
other branches). ``tree_attention_mask`` says precisely that, and ``tree_positions`` gives node i the
position ``S_past + depth(i)`` it would have in that plain sequence (RoPE only sees positions, not where
a row sits in the batch). So the target's logits at node i equal a plain forward's last logits of
``past + path(i)`` (up to float rounding), for every node at once.

Greedy verification (temperature 0, exact): a node is accepted when its parent was accepted and its
token is the target's argmax at its parent. The deepest accepted node ends the accepted path; the
target's argmax there is one more token for free (the correction, or the bonus when the path reached a
leaf). Then the KV cache, which now holds the past plus all N nodes, is compacted to the past plus the
accepted path, in order (``compact_cache``).
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

from course_lib.kvcache import ContiguousCache, StaticCache

__all__ = ["TokenTree", "build_tree", "cartesian_paths", "chain_paths", "tree_attention_mask",
           "tree_positions", "tree_depths", "verify_tree", "TreeVerification", "compact_cache",
           "DEFAULT_PATHS"]

# A small sparse tree (4 nodes with the root): top-2 at depth 1, then the top-1 after the favourite. On
# the bundled pair on one CPU thread it was the fastest of the trees tried (1 to 22 nodes): a target
# forward over N tokens costs much more than one token there (small-M matmuls), so bigger trees gain
# accepted tokens but lose more time. On a GPU, where N <= ~64 tokens cost about one token, Medusa's
# trees have dozens of nodes.
DEFAULT_PATHS: list[tuple[int, ...]] = [(0,), (1,), (0, 0)]


# --------------------------------------------------------------------------------------------------
# The tree
# --------------------------------------------------------------------------------------------------
def _check_parents(parents, name="parents") -> list[int]:
    if isinstance(parents, torch.Tensor):
        parents = parents.tolist()
    try:
        parents = [int(p) for p in parents]
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of ints (parent node index per node), got {parents!r}")
    if len(parents) == 0:
        raise ValueError(f"{name}: the tree is empty; it needs at least the root node")
    if parents[0] != -1:
        raise ValueError(f"{name}[0] must be -1 (node 0 is the root), got {parents[0]}")
    for i, p in enumerate(parents[1:], start=1):
        if not 0 <= p < i:
            raise ValueError(f"{name}[{i}] = {p}: every parent index must satisfy 0 <= parent < node index "
                             f"(parents come before their children)")
    return parents


def tree_depths(parents) -> list[int]:
    """Depth of every node (root = 0); parents come first, so one left-to-right sweep suffices."""
    parents = _check_parents(parents)
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


@dataclass
class TokenTree:
    """A candidate tree: ``tokens[i]`` at node i, following node ``parents[i]`` (root: parents[0] = -1).

    tokens: [N] long. parents: N ints with parents[i] < i. paths: the Medusa top-k paths the tree was
    built from (empty for a hand-made tree), ``paths[i-1]`` belongs to node i.
    """
    tokens: torch.Tensor
    parents: list[int]
    paths: list[tuple[int, ...]] = field(default_factory=list)

    def __post_init__(self):
        if not isinstance(self.tokens, torch.Tensor):
            self.tokens = torch.as_tensor(self.tokens, dtype=torch.long, device="cpu")   # a list: host tokens
        if self.tokens.dim() != 1 or self.tokens.dtype not in (torch.long, torch.int32):
            raise TypeError(f"tokens must be an integer tensor [N], got {self.tokens.dtype} "
                            f"of shape {tuple(self.tokens.shape)}")
        if self.tokens.numel() == 0:
            raise ValueError("tokens: the tree is empty; it needs at least the root node")
        self.parents = _check_parents(self.parents)
        if len(self.parents) != self.tokens.numel():
            raise ValueError(f"parents has {len(self.parents)} entries but tokens has {self.tokens.numel()}")
        self.tokens = self.tokens.long()

    @property
    def size(self) -> int:
        return len(self.parents)

    @property
    def depths(self) -> list[int]:
        return tree_depths(self.parents)

    @property
    def max_depth(self) -> int:
        return max(self.depths)

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, both included."""
        if not 0 <= node < self.size:
            raise ValueError(f"node must be in [0, {self.size}), got {node}")
        out = [node]
        while self.parents[out[-1]] >= 0:
            out.append(self.parents[out[-1]])
        return out[::-1]


def _check_paths(paths) -> list[tuple[int, ...]]:
    """Paths as tuples, sorted parents-first (by depth, then lexicographically), prefix-closed."""
    try:
        paths = [tuple(int(c) for c in p) for p in paths]
    except (TypeError, ValueError):
        raise TypeError(f"paths must be a list of tuples of top-k indices, e.g. [(0,), (1,), (0, 0)], got {paths!r}")
    if len(set(paths)) != len(paths):
        raise ValueError("paths: contains the same path twice")
    seen = set(paths)
    for p in paths:
        if len(p) == 0:
            raise ValueError("paths: the empty path () is the root, which is always there; leave it out")
        if min(p) < 0:
            raise ValueError(f"paths: top-k indices must be >= 0, got {p}")
        if len(p) > 1 and p[:-1] not in seen:
            raise ValueError(f"paths must be prefix-closed: {p} needs its parent path {p[:-1]}")
    return sorted(paths, key=lambda p: (len(p), p))


def build_tree(candidates_per_depth, paths, root: int) -> TokenTree:
    """The Medusa sparse tree: node for path (i_1, ..., i_d) holds the i_d-th candidate at depth d.

    candidates_per_depth: sequence of 1-D tensors (or lists), entry d-1 = the candidates for depth d,
        best first (e.g. the top-k of Medusa head d-1). A head does not see the path above it, so the
        same candidate list serves every node at that depth: the tree is a pruned Cartesian product.
    paths: prefix-closed list of top-k index tuples (see the module docstring); [] gives the root alone,
        which makes verification a plain decoding step.
    root: the last decided token (node 0).
    Returns a TokenTree with nodes ordered by depth, so every parent index is smaller than its child's,
    its tokens on the candidates' device (the CPU for lists).
    """
    paths = _check_paths(paths)
    device = next((c.device for c in candidates_per_depth if isinstance(c, torch.Tensor)), torch.device("cpu"))
    # One host copy per depth (not one device sync per node): the tree is built in Python.
    cands = [(c if isinstance(c, torch.Tensor) else torch.as_tensor(c, device="cpu")).reshape(-1).long().tolist()
             for c in candidates_per_depth]
    index = {(): 0}
    tokens, parents = [int(root)], [-1]
    for p in paths:
        d = len(p)
        if d > len(cands):
            raise ValueError(f"paths: {p} has depth {d} but candidates_per_depth has only {len(cands)} depths")
        if p[-1] >= len(cands[d - 1]):
            raise ValueError(f"paths: {p} asks for candidate {p[-1]} at depth {d} but candidates_per_depth"
                             f"[{d - 1}] has only {len(cands[d - 1])}")
        index[p] = len(tokens)
        tokens.append(int(cands[d - 1][p[-1]]))
        parents.append(index[p[:-1]])
    return TokenTree(torch.tensor(tokens, dtype=torch.long, device=device), parents, paths)


def cartesian_paths(topk) -> list[tuple[int, ...]]:
    """All paths of the full Cartesian tree with topk[d] choices at depth d+1 (e.g. (2, 2) -> 6 paths)."""
    topk = [int(k) for k in topk]
    if any(k < 1 for k in topk):
        raise ValueError(f"topk must be positive per depth, got {topk}")
    out = []
    for d in range(1, len(topk) + 1):
        out.extend(itertools.product(*[range(k) for k in topk[:d]]))
    return out


def chain_paths(depth: int) -> list[tuple[int, ...]]:
    """The top-1 chain (0,), (0, 0), ...: ordinary draft-then-verify with the heads as the draft."""
    if not isinstance(depth, int) or depth < 0:
        raise ValueError(f"depth must be an int >= 0, got {depth!r}")
    return [(0,) * d for d in range(1, depth + 1)]


# --------------------------------------------------------------------------------------------------
# Mask and positions
# --------------------------------------------------------------------------------------------------
def tree_attention_mask(parents, past_len: int = 0, device=None) -> torch.Tensor:
    """Boolean mask [N, past_len + N], True = may attend: every past token, then the node's ancestors and itself.

    With past_len = 0 this is the [N, N] tree mask; with the cache length it is the ``attn_mask`` the
    model takes for a forward of the N tree nodes on top of the cache.
    """
    parents = _check_parents(parents)
    if not isinstance(past_len, int) or past_len < 0:
        raise ValueError(f"past_len must be an int >= 0, got {past_len!r}")
    N = len(parents)
    # Built on the host (a Python loop over rows would be N tiny kernels on a GPU), then moved once.
    tree = torch.zeros(N, N, dtype=torch.bool, device="cpu")
    for i in range(N):
        if parents[i] >= 0:
            tree[i] = tree[parents[i]]  # the parent's row already holds all of its ancestors
        tree[i, i] = True
    past = torch.ones(N, past_len, dtype=torch.bool, device="cpu")
    return torch.cat([past, tree], dim=1).to(device)  # [N, past_len + N]


def tree_positions(parents, start: int, device=None) -> torch.Tensor:
    """Positions [N] = start + depth: node i sits where it would in the plain sequence past + path(i)."""
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be an int >= 0, got {start!r}")
    return torch.tensor(tree_depths(parents), dtype=torch.long, device=device) + start


# --------------------------------------------------------------------------------------------------
# Cache compaction
# --------------------------------------------------------------------------------------------------
def compact_cache(cache, keep: torch.Tensor):
    """Keep only the positions `keep` ([M] long, increasing) of every layer, in that order.

    Works on ``ContiguousCache`` (per-layer tensors ``cache.k[l]``, ``cache.v[l]`` [B, K, S, Dh], replaced
    by an index_select) and ``StaticCache`` (the kept rows are written to the front of the buffer).
    """
    if not isinstance(cache, (ContiguousCache, StaticCache)):
        raise TypeError(f"cache must be a ContiguousCache or StaticCache, got {type(cache).__name__}")
    keep = keep.long() if isinstance(keep, torch.Tensor) else torch.as_tensor(keep, dtype=torch.long, device="cpu")
    S = cache.get_seq_length()
    if keep.dim() != 1 or (keep.numel() and (int(keep.min()) < 0 or int(keep.max()) >= S)):
        raise ValueError(f"keep must be a 1-D tensor of positions in [0, {S}), got {keep.tolist()}")
    if keep.numel() > 1 and not bool((keep[1:] > keep[:-1]).all()):
        raise ValueError("keep must be strictly increasing (the kept tokens stay in sequence order)")
    M = keep.numel()
    for layer in range(len(cache.k)):
        idx = keep.to(cache.k[layer].device)
        k = cache.k[layer].index_select(2, idx)  # [B, K, M, Dh]
        v = cache.v[layer].index_select(2, idx)
        if isinstance(cache, StaticCache):
            cache.k[layer][:, :, :M] = k
            cache.v[layer][:, :, :M] = v
        else:
            cache.k[layer], cache.v[layer] = k, v
    if isinstance(cache, StaticCache):
        cache.crop(M)
    return cache


# --------------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------------
@dataclass
class TreeVerification:
    """The outcome of one tree verification.

    path: accepted node indices, root first (root always accepted). tokens: the accepted candidate
    tokens (the path without the root), so ``len(tokens)`` is the number accepted. next_token: the
    target's greedy token after the path (correction or bonus). hidden: [D] the target's final hidden
    state at the last path node (what Medusa heads read next). logits: [N, V] target logits per node.
    """
    path: list[int]
    tokens: list[int]
    next_token: int
    hidden: torch.Tensor
    logits: torch.Tensor

    @property
    def num_accepted(self) -> int:
        return len(self.tokens)

    @property
    def emitted(self) -> list[int]:
        """New tokens this pass adds to the output: the accepted candidates and the next token."""
        return [*self.tokens, self.next_token]


@torch.no_grad()
def verify_tree(target, cache, tree: TokenTree, compact: bool = True) -> TreeVerification:
    """Score all tree nodes in one target forward and keep the longest greedily-correct path.

    cache: the target's KV cache holding the past (everything before the root), batch size 1. After the
    call it holds the past plus the accepted path, root first, so the next pass starts right after it.

    Why the RoPE positions stay right after compaction: keys are stored already rotated. Node i was
    rotated with position S_past + depth(i). The accepted path has exactly one node per depth 0..d, and
    compaction puts the depth-j node at cache index S_past + j, which is the position it was rotated
    with. So the compacted cache is what a plain forward of past + path would have written (checked in
    the tests against a fresh recompute). Nodes off the path are dropped, and nothing else moves.
    """
    if not isinstance(tree, TokenTree):
        raise TypeError(f"tree must be a TokenTree (see build_tree), got {type(tree).__name__}")
    past = cache.get_seq_length()
    if cache.k and cache.k[0].shape[0] != 1:
        raise ValueError(f"cache: tree verification is for batch size 1, the cache holds batch "
                         f"{cache.k[0].shape[0]}")
    device = target.device
    ids = tree.tokens.to(device)[None]                                  # [1, N]
    positions = tree_positions(tree.parents, past, device=device)       # [N]
    mask = tree_attention_mask(tree.parents, past, device=device)       # [N, past + N]
    logits, hidden = target(ids, cache=cache, positions=positions, attn_mask=mask, return_hidden=True)
    logits, hidden = logits[0], hidden[0]                               # [N, V], [N, D]
    greedy = logits.argmax(-1).tolist()                                 # target's pick after each node

    # A node is accepted when its parent is and its token is the target's pick at the parent.
    tokens = tree.tokens.tolist()
    accepted = [True] + [False] * (tree.size - 1)
    depth = tree.depths
    for i in range(1, tree.size):
        p = tree.parents[i]
        accepted[i] = accepted[p] and tokens[i] == greedy[p]
    # The deepest accepted node ends the path (ties: the lower index; with distinct sibling tokens,
    # as top-k candidates are, at most one child per node can match, so there is no tie).
    last = max((i for i in range(tree.size) if accepted[i]), key=lambda i: (depth[i], -i))
    path = tree.path_to(last)
    if compact:
        if path == list(range(len(path))):       # the path is a prefix of the node order: just crop
            cache.crop(past + len(path))
        else:
            keep = torch.cat([torch.arange(past, device=device),
                              past + torch.tensor(path, dtype=torch.long, device=device)])
            compact_cache(cache, keep)
    return TreeVerification(path=path, tokens=[tokens[i] for i in path[1:]], next_token=greedy[last],
                            hidden=hidden[last], logits=logits)
