"""Acceptance rules for token trees (several sibling candidates per node), as tensor functions.

Names follow the tensors: ``target_probs`` from the target, ``draft_probs`` from the drafter.

* `sibling_accept`: recursive rejection over one node's children, tried in rank order, with
  p_1 = target_probs. Deterministic children (draft_probs None, e.g. the draft's top-k) are
  one-hot drafts: x_i is kept with probability p_i(x_i), else p_{i+1} = normalise(p_i with x_i
  zeroed). Children drawn without replacement from q (q_1 = q, q_{i+1} = normalise(q_i with
  x_i zeroed)): x_i is kept with probability min(1, p_i(x_i) / q_i(x_i)), else
  p_{i+1} = normalise(max(0, p_i - q_i)). When all k are rejected the node's token is drawn from
  p_{k+1}. Either way the emitted token is distributed exactly as target_probs.
* `tree_accept`: that rule from the root down; the bonus token at a leaf. Its batched core,
  `tree_accept_batched`, walks every level on the device and syncs with the host once.
* `tree_accept_greedy`: the temperature-0 twin (the target's argmax path), one host copy.
* `sample_without_replacement`: k distinct draws (Gumbel top-k), the q_i sequence above.
"""

from __future__ import annotations

from typing import Any

import torch
from dreams_nas.supernet.core.errors import InputError
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.sampling import sample
from torch import Tensor

_TINY = 1e-30


def sample_without_replacement(probs: Tensor, k: int, generator: torch.Generator | None
                               ) -> Tensor:
    """(..., vocab) probabilities -> (..., k) long: k distinct tokens in draw order.

    Drawn as the top k of log(probs) + Gumbel noise, which orders tokens exactly as drawing one
    at a time and renormalising what is left. Where fewer than k tokens have mass, distinct
    zero-probability tokens fill the tail (a verifier rejects them)."""
    vocab = probs.shape[-1]
    if not 1 <= k <= vocab:
        raise InputError(f"cannot draw k={k} distinct tokens from a vocabulary of {vocab}; "
                         "use 1 <= k <= vocab")
    noise = torch.empty_like(probs, dtype=torch.float32).exponential_(generator=generator)
    keys = probs.float().log() - noise.clamp_min(_TINY).log()
    keys = keys.masked_fill(probs <= 0, float("-inf"))
    return keys.topk(k, dim=-1).indices


def _normalise(probs: Tensor, fallback: Tensor) -> Tensor:
    """Rows of `probs` (B, vocab) scaled to sum 1; `fallback`'s row where a row has no mass."""
    total = probs.sum(-1, keepdim=True)
    return torch.where(total > 0, probs / total.clamp_min(_TINY), fallback)


def _rejection_chain(candidates: Tensor, target_probs: Tensor, draft_probs: Tensor | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """Everything the sibling rule needs, assuming each candidate is rejected in turn.

    candidates (B, k); target_probs, draft_probs (B, vocab). Returns (num, den, residual):
    x_i is kept when u * den[:, i] < num[:, i] (both (B, k); den 0 never keeps), and
    residual (B, vocab) is p_{k+1}."""
    p = target_probs.float()
    q = None if draft_probs is None else draft_probs.float()
    nums, dens = [], []
    for i in range(candidates.shape[1]):
        x = candidates[:, i : i + 1]  # (B, 1)
        px = p.gather(1, x)[:, 0]
        if q is None:  # a one-hot draft on x: keep with probability p_i(x)
            dens.append(torch.ones_like(px))
            nxt = p.scatter(1, x, 0.0)
        else:
            qx = q.gather(1, x)[:, 0]
            dens.append(qx)
            # a candidate q_i could not have drawn (a filler) is skipped: p stays as it is
            nxt = torch.where((qx > 0)[:, None], (p - q).clamp_min(0), p)
            q = q.scatter(1, x, 0.0)
            q = q / q.sum(-1, keepdim=True).clamp_min(_TINY)
        nums.append(px)
        # no mass left only where rejecting x had probability 0 (p_i == q_i): keep p_i
        p = _normalise(nxt, p)
    return torch.stack(nums, 1), torch.stack(dens, 1), p


def _first_kept(num: Tensor, den: Tensor, generator: torch.Generator | None) -> Tensor:
    """(B, k) odds from `_rejection_chain` -> (B,) long: the first kept candidate, or -1."""
    batch, k = num.shape
    u = torch.rand(batch, k, generator=generator, device=num.device)
    kept = (u * den < num) & (den > 0)  # u < num / den, without dividing by zero
    done = torch.ones(batch, 1, dtype=torch.bool, device=kept.device)
    first = torch.cat((kept, done), 1).int().argmax(-1)  # k when every candidate is rejected
    return torch.where(first < k, first, -1)


def sibling_accept_batched(candidates: Tensor, target_probs: Tensor, draft_probs: Tensor | None,
                           generator: torch.Generator | None) -> tuple[Tensor, Tensor]:
    """The sibling rule on B independent nodes, without a host sync.

    candidates (B, k) long; target_probs (B, vocab); draft_probs (B, vocab) or None. Returns
    (index (B,) long: the kept candidate or -1, residual_token (B,) long: a draw from the
    residual, the node's token where index is -1)."""
    num, den, residual = _rejection_chain(candidates, target_probs, draft_probs)
    return _first_kept(num, den, generator), sample(residual, generator)


def sibling_accept(candidates: Tensor, target_probs: Tensor, draft_probs: Tensor | None,
                   generator: torch.Generator | None) -> tuple[int, Tensor | None]:
    """candidates (k,) long, tried in order; target_probs (vocab,) at the parent; draft_probs
    None (candidates chosen deterministically) or the (vocab,) q they were drawn from without
    replacement. Returns (index of the kept candidate, None) or (-1, the (vocab,) residual to
    draw the node's token from). One host sync."""
    num, den, residual = _rejection_chain(candidates[None], target_probs[None],
                                          None if draft_probs is None else draft_probs[None])
    index = int(_first_kept(num, den, generator))
    return index, (residual[0] if index < 0 else None)


def _check_tree_inputs(tree: TokenTree, node_tokens: Tensor, rows: Tensor) -> None:
    n = tree.nodes + 1
    if node_tokens.shape[-1] != n or rows.shape[-2] != n:
        raise InputError(f"tree {tree.label} has {n} nodes with the root, but node_tokens has "
                         f"shape {tuple(node_tokens.shape)} and the target rows "
                         f"{tuple(rows.shape)}; pass one entry per node, root first")


def tree_accept_batched(tree: TokenTree, node_tokens: Tensor, target_probs: Tensor,
                        draft_probs: Tensor | None, generator: torch.Generator | None
                        ) -> tuple[Tensor, Tensor]:
    """`tree_accept` on B independent trees of one shape, every level on the device.

    node_tokens (B, nodes+1) long; target_probs (B, nodes+1, vocab); draft_probs likewise or
    None. Returns (last accepted node (B,) long, next token (B,) long)."""
    _check_tree_inputs(tree, node_tokens, target_probs)
    batch = node_tokens.shape[0]
    device = node_tokens.device
    rows = torch.arange(batch, device=device)
    cur = torch.zeros(batch, dtype=torch.long, device=device)
    stopped = torch.zeros(batch, dtype=torch.bool, device=device)
    token = torch.zeros(batch, dtype=torch.long, device=device)
    for d, width in enumerate(tree.branching):
        # under one parent the children are consecutive, parent-major (breadth first)
        start, child_start = tree.nodes_at(d).start, tree.nodes_at(d + 1).start
        kids = (child_start + (cur - start) * width)[:, None] + torch.arange(width, device=device)
        q = None if draft_probs is None else draft_probs[rows, cur]
        index, drawn = sibling_accept_batched(node_tokens.gather(1, kids),
                                              target_probs[rows, cur], q, generator)
        newly = ~stopped & (index < 0)
        token = torch.where(newly, drawn, token)
        stopped = stopped | newly
        cur = torch.where(stopped, cur, kids.gather(1, index.clamp_min(0)[:, None])[:, 0])
    bonus = sample(target_probs[rows, cur], generator)  # a leaf was reached: the bonus token
    return cur, torch.where(stopped, token, bonus)


def tree_accept(tree: TokenTree, node_tokens: Tensor, target_probs: Tensor,
                draft_probs: Tensor | None, generator: torch.Generator | None,
                with_ids: bool = False) -> tuple[list[int], Any]:
    """Walk `tree` from the root with `sibling_accept` at every node.

    node_tokens (nodes+1,) long (the root's is ignored); target_probs (nodes+1, vocab): the
    target's processed distribution after each node; draft_probs None (deterministic children)
    or (nodes+1, vocab): at node i, what its children were drawn from (leaves' rows unread).
    Returns (accepted node numbers, root first; the next token), or with `with_ids` (the
    path, the tokens kept: the path's drafts then the next token). One host sync."""
    last, token = tree_accept_batched(tree, node_tokens[None], target_probs[None],
                                      None if draft_probs is None else draft_probs[None],
                                      generator)
    last_node, next_token, *tokens = torch.cat((last, token, node_tokens.long())).tolist()
    path = tree.path(last_node)
    return path, ([tokens[i] for i in path[1:]] + [next_token] if with_ids else next_token)


def tree_accept_greedy(tree: TokenTree, node_tokens: Tensor, target_tokens: Tensor,
                       with_ids: bool = False) -> tuple[list[int], Any]:
    """node_tokens, target_tokens (nodes+1,) long (the target's argmax after each node) ->
    (the path that follows the target's argmax from the root, the target's token after it;
    with `with_ids`, the tokens kept instead: the path's drafts then that token). One host copy.

    At each node the first child in rank order whose token is the target's argmax is taken."""
    _check_tree_inputs(tree, node_tokens, target_tokens[:, None])
    tokens, targets = torch.stack((node_tokens.long(), target_tokens.long())).tolist()
    path = [0]
    while True:
        want = targets[path[-1]]
        nxt = next((c for c in tree.children(path[-1]) if tokens[c] == want), None)
        if nxt is None:
            return path, ([tokens[c] for c in path[1:]] + [want] if with_ids else want)
        path.append(nxt)
