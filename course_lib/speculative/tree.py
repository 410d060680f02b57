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
accepted path, in order (the cache's ``compact``, ``course_lib.kvcache``).

Where the code is: building trees (``build_tree``, Medusa's paths) is here; the tree itself, its mask and
positions and ``verify_tree`` live beside the one generate loop
(``course_lib.generation``), which verifies a tree that a draft proposes (``generate(..., draft=)``, e.g.
``medusa.MedusaDraft``); they are re-exported here.
"""
from __future__ import annotations

import itertools

import torch

from course_lib.generation import (TokenTree, TreeVerification, tree_attention_mask, tree_depths, tree_positions,
                                   verify_tree)

__all__ = ["TokenTree", "build_tree", "cartesian_paths", "chain_paths", "tree_attention_mask",
           "tree_positions", "tree_depths", "verify_tree", "TreeVerification",
           "DEFAULT_PATHS"]

# A small sparse tree (4 nodes with the root): top-2 at depth 1, then the top-1 after the favourite. On
# the bundled pair on one CPU thread it was the fastest of the trees tried (1 to 22 nodes): a target
# forward over N tokens costs much more than one token there (small-M matmuls), so bigger trees gain
# accepted tokens but lose more time. On a GPU, where N <= ~64 tokens cost about one token, Medusa's
# trees have dozens of nodes.
DEFAULT_PATHS: list[tuple[int, ...]] = [(0,), (1,), (0, 0)]


# --------------------------------------------------------------------------------------------------
# Trees from Medusa's top-k paths
# --------------------------------------------------------------------------------------------------
def check_paths(paths) -> list[tuple[int, ...]]:
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
    paths = check_paths(paths)
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
