"""The Optuna parameters of a space's subnets: one categorical per spec field (a space of one
draft size samples the three of the paper), or the draft's shape in place of draft_len when the
space has token trees; `spec_of` and `params_of` map a trial's parameters to its subnet and
back."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dreams_nas.nas.search.sampler import distribution_of
from dreams_nas.supernet.core.space import SearchSpace
from dreams_nas.supernet.core.spec import SIZE_DEFAULTS, SPEC_FIELDS, SubnetSpec
from optuna.distributions import CategoricalDistribution

TRIPLE_FIELDS = tuple(n for n in SPEC_FIELDS if n != "draft_len")  # every space samples these
SHAPE_PARAM = "shape"  # a space with token trees: draft_len and tree in one categorical


def arch_params(space: SearchSpace) -> tuple[str, ...]:
    """The Optuna parameters of `space`'s architectures (the sweep's grid): heads, visual_keep
    and inject_layer, then each of depth, mlp and draft_vocab where the space holds other than
    its one default (`SIZE_DEFAULTS`)."""
    sizes = tuple(n for n, d in SIZE_DEFAULTS.items() if tuple(getattr(space, n)) != (d,))
    return (*TRIPLE_FIELDS, *sizes)


def search_distributions(space: SearchSpace) -> dict[str, Any]:
    """The Optuna parameters of `space`'s subnets: one per field (`arch_params`, then
    draft_len); a space with token trees samples the draft's shape (``g5`` a chain,
    ``t4x2x1`` a tree) as one categorical in place of draft_len, since a tree fixes its
    draft_len."""
    names = arch_params(space) + (() if space.trees else ("draft_len",))
    out = {name: distribution_of(getattr(space, name)) for name in names}
    if space.trees:
        out[SHAPE_PARAM] = CategoricalDistribution(
            [SubnetSpec(1, 1.0, 0, g, tree).shape_id for g, tree in space.shapes])
    return out


def spec_of(params: Mapping[str, Any]) -> SubnetSpec:
    """The subnet of a trial's parameters (`search_distributions`); depth, mlp and
    draft_vocab absent (a space of one draft size, the whole vocabulary) are 1, 1.0 and 1.0."""
    fields = {name: params[name] for name in (*TRIPLE_FIELDS, *SIZE_DEFAULTS) if name in params}
    if SHAPE_PARAM not in params:
        return SubnetSpec(**fields, draft_len=params["draft_len"])
    label = str(params[SHAPE_PARAM])
    if label.startswith("t"):
        return SubnetSpec(**fields, draft_len=1).replace(tree=label[1:])
    return SubnetSpec(**fields, draft_len=int(label[1:]))


def params_of(spec: SubnetSpec, distributions: Mapping[str, Any]) -> dict[str, Any]:
    """The trial parameters of `spec` under `distributions` (the inverse of `spec_of`)."""
    fields = {n: getattr(spec, n) for n in (*SPEC_FIELDS, *SIZE_DEFAULTS)}
    fields[SHAPE_PARAM] = spec.shape_id
    return {name: fields[name] for name in distributions}
