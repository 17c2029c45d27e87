"""One speculative cycle over a token tree: draft the tree, verify every node in one target
forward (tree attention), accept the longest path the target agrees with, compact the target's
cache to that path.

At temperature 0 the accepted path follows the target's own argmax from the root, so the output
is the target's greedy output token for token, as with chains. With sampling, siblings are tried
by recursive rejection (`tree_sampling.tree_accept`), which keeps the output distributed as the
target's.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from dreams_nas.supernet.core.tree import TokenTree
from dreams_nas.supernet.decoding.protocol import Drafter, TreeProposal
from dreams_nas.supernet.decoding.sampling import SamplingConfig, logits_to_probs
from dreams_nas.supernet.decoding.tree_sampling import tree_accept, tree_accept_greedy
from dreams_nas.supernet.target.adapter import TargetAdapter, VerifyOutput
from torch import Tensor


def fitted_tree(tree: TokenTree, draft_len: int) -> TokenTree:
    """`tree` cut to at most `draft_len` levels (the budget left): its first levels are a prefix of
    its breadth-first nodes, so the cut tree drafts a prefix of the same nodes."""
    return tree if tree.draft_len <= draft_len else TokenTree(tree.branching[:draft_len])


def verify_tree(target: TargetAdapter, last_token: Tensor, proposal: TreeProposal,
                sampling: SamplingConfig, generator: torch.Generator | None,
                layers: tuple[int, ...]) -> tuple[list[int], list[int], Tensor, VerifyOutput]:
    """One target forward over [last_token, the tree's nodes]; returns the accepted path (node
    numbers, root first), the kept tokens (the path's drafts then the target's next token) on
    the host and (1, n + 1) on the device, and the verify output of the committed positions.
    The target's cache keeps the path only."""
    tree = proposal.tree
    nodes = torch.cat((last_token, proposal.tokens.to(last_token.device)), dim=1)  # (1, N+1)
    out = target.verify_tree(nodes, tree.parents, layers)
    node_tokens = nodes[0].to(out.logits.device)
    if sampling.greedy:
        path, ids = tree_accept_greedy(tree, node_tokens, out.logits[0].argmax(-1),
                                       with_ids=True)
    else:
        target_probs = logits_to_probs(out.logits[0], sampling)  # (N+1, vocab)
        draft_probs = proposal.draft_probs
        if draft_probs is not None:  # rows for the inner nodes; the leaves' are never read
            draft_probs = torch.zeros_like(target_probs).index_copy_(
                0, torch.arange(draft_probs.shape[1], device=target_probs.device),
                draft_probs[0].to(target_probs))
        path, ids = tree_accept(tree, node_tokens, target_probs, draft_probs, generator,
                                with_ids=True)
    # the cycle's one wait for the device was the acceptance's copy to the host; what goes
    # back (the path's positions and the kept tokens) is one copy from pinned memory that
    # does not wait for the device (a pageable one would synchronise the stream first)
    both = torch.tensor(path + ids, dtype=torch.long,  # cpu: pinned, then one copy over
                        pin_memory=out.logits.device.type == "cuda")
    both = both.to(out.logits.device, non_blocking=True)
    index, kept_tokens = both[:len(path)], both[len(path):][None]
    target.keep_path(path, tree.nodes + 1, index=index)
    kept = VerifyOutput(out.logits[:, index], out.last_hidden[:, index],
                        {i: h[:, index] for i, h in out.layer_hidden.items()})
    return path, ids, kept_tokens, kept


def tree_step(target: TargetAdapter, drafter: Drafter, last_token: Tensor, tree: TokenTree,
              sampling: SamplingConfig, generator: torch.Generator | None,
              lap: Callable[[str], None]) -> tuple[int, Tensor, list[int]]:
    """Draft a tree, verify, accept, update the drafter: (n accepted, the kept tokens (1, n+1)
    on the device, the same on the host)."""
    proposal = drafter.propose_tree(last_token, tree, sampling, generator)  # type: ignore[attr-defined]
    lap("draft")
    path, ids, tokens, kept = verify_tree(target, last_token, proposal, sampling, generator,
                                          drafter.required_layers)
    lap("verify")
    drafter.update(tokens, len(path) - 1, kept)
    lap("draft")
    return len(path) - 1, tokens, ids
