"""One speculative cycle of a token tree for every row of a batch (`batch_loop`): draft each
row's tree, verify every row's nodes in one batched forward (each row's tree mask over its own
cache), accept each row's path by the batch-1 rules, and pack each row's path in its cache.

The acceptance runs on the device for every row at once: at temperature 0 each row follows the
target's argmax from the root through the first child in rank order that carries it (as
`tree_sampling.tree_accept_greedy`); with sampling, siblings are tried by recursive rejection
(`tree_sampling.tree_accept_batched`). Every row's path comes from a table of the tree's paths
indexed by its last node, so one host copy a cycle brings the accepted lengths and tokens back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.sampling import SamplingConfig, logits_to_probs
from dreams_nas.supernet.decoding.tree_sampling import tree_accept_batched
from dreams_nas.supernet.target.tree_attention import build_layout
from torch import Tensor


def greedy_paths(tree: TokenTree, node_tokens: Tensor, target_tokens: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """node_tokens, target_tokens (B, nodes + 1) -> (each row's last accepted node (B,), the
    target's token after it (B,)): from the root, the first child in rank order whose token is
    the target's argmax at its parent, while there is one."""
    batch, device = node_tokens.shape[0], node_tokens.device
    cur = torch.zeros(batch, dtype=torch.long, device=device)
    going = torch.ones(batch, dtype=torch.bool, device=device)
    for d, width in enumerate(tree.branching):
        start, child_start = tree.nodes_at(d).start, tree.nodes_at(d + 1).start
        kids = (child_start + (cur - start) * width)[:, None] + torch.arange(width, device=device)
        kids = kids.clamp(0, tree.nodes)  # a stopped row's (unused) kids stay in range
        want = target_tokens.gather(1, cur[:, None])  # (B, 1)
        match = node_tokens.gather(1, kids) == want  # (B, width)
        going = going & match.any(dim=1)
        first = match.int().argmax(dim=1, keepdim=True)
        cur = torch.where(going, kids.gather(1, first)[:, 0], cur)
    return cur, target_tokens.gather(1, cur[:, None])[:, 0]


class _Paths:
    """A tree's root-to-node paths as device tables: node -> its path (padded with itself to
    draft_len + 1) and its depth."""

    def __init__(self, tree: TokenTree, device: torch.device) -> None:
        width = tree.draft_len + 1
        paths = [tree.path(i) for i in range(tree.nodes + 1)]
        self.index = torch.tensor([p + [p[-1]] * (width - len(p)) for p in paths],
                                  device=device)  # (nodes + 1, draft_len + 1)
        self.depth = torch.tensor([len(p) - 1 for p in paths], device=device)


_TABLES: dict[tuple[tuple[int, ...], str, str], tuple[_Paths, Any]] = {}


def _tables(tree: TokenTree, device: torch.device, dtype: torch.dtype) -> tuple[_Paths, Any]:
    key = (tree.branching, str(device), str(dtype))
    if key not in _TABLES:
        _TABLES[key] = (_Paths(tree, device), build_layout(tree.parents, device, dtype))
    return _TABLES[key]


def batch_tree_cycle(rows: Any, drafter: Any, last: Tensor, tree: TokenTree,
                     sampling: SamplingConfig, generator: torch.Generator | None, alive: Tensor,
                     lap: Callable[[str], None]) -> tuple[Tensor, Tensor, list[list[int]]]:
    """`batch_loop.batch_cycle` for a token tree: (n (B,), kept (B, draft_len + 1), on the
    host [n, kept...] per row)."""
    proposal = drafter.propose_tree(last, tree, sampling, generator)
    lap("draft")
    nodes = torch.cat((last, proposal.tokens.to(last.device)), dim=1)  # (B, nodes + 1)
    paths, layout = _tables(tree, last.device, rows.lm_head.weight.dtype)
    logits, hidden = rows.tree(nodes, layout.levels, layout.bias)
    if sampling.greedy:
        cur, token = greedy_paths(tree, nodes, logits.argmax(-1))
    else:
        target_probs = logits_to_probs(logits, sampling)  # (B, nodes + 1, vocab)
        draft_probs = proposal.draft_probs
        if draft_probs is not None:  # rows for the inner nodes; the leaves' are never read
            draft_probs = torch.zeros_like(target_probs).index_copy_(
                1, torch.arange(draft_probs.shape[1], device=target_probs.device),
                draft_probs.to(target_probs))
        cur, token = tree_accept_batched(tree, nodes, target_probs, draft_probs, generator)
    index = paths.index[cur]  # (B, draft_len + 1): each row's path, root first
    n = torch.where(alive, paths.depth[cur], -1)
    kept = torch.cat((nodes.gather(1, index[:, 1:]), token[:, None]), dim=1)
    kept = kept.scatter(1, n.clamp(min=0)[:, None], token[:, None])  # the path, then the token
    table = torch.cat((n[:, None], kept), dim=1).tolist()  # the cycle's one wait
    rows.keep_paths(index, n, nodes.shape[1], [row[0] for row in table])
    lap("verify")
    drafter.update(kept, n, hidden.gather(1, index[..., None].expand(-1, -1, hidden.shape[-1])))
    lap("draft")
    return n, kept, table
