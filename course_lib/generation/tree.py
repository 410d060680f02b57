"""Token trees and their verification in one target forward (SpecInfer, Medusa; why the mask makes it exact:
``course_lib.speculative.tree``)."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from course_lib.validate import integer


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



def tree_attention_mask(parents, past_len: int = 0, device=None) -> torch.Tensor:
    """Boolean mask [N, past_len + N], True = may attend: every past token, then the node's ancestors and itself.

    With past_len = 0 this is the [N, N] tree mask; with the cache length it is the ``attn_mask`` the
    model takes for a forward of the N tree nodes on top of the cache.
    """
    parents = _check_parents(parents)
    past_len = integer(past_len, "past_len", low=0)
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
    start = integer(start, "start", low=0)
    return torch.tensor(tree_depths(parents), dtype=torch.long, device=device) + start


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
            cache.compact(keep)
    return TreeVerification(path=path, tokens=[tokens[i] for i in path[1:]], next_token=greedy[last],
                            hidden=hidden[last], logits=logits)
