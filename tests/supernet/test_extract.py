from __future__ import annotations

import json
import math

import pytest
import torch
from _support.drafts import HIDDEN, tiny_draft, tiny_prompt, tiny_shared
from dreams_nas.supernet.core.errors import InputError, MissingArtefactError
from dreams_nas.supernet.core.spec import SubnetSpec
from dreams_nas.supernet.draft.config import DraftConfig
from dreams_nas.supernet.draft.extract import CompactDraft, extract
from dreams_nas.supernet.draft.model import DreamDraft
from dreams_nas.supernet.draft.saving import load_supernet, read_supernet_config, save_supernet
from dreams_nas.supernet.draft.state import DraftCache

pytestmark = pytest.mark.usefixtures("one_thread")


SPECS = [SubnetSpec(1, 0.25, 1, 1), SubnetSpec(2, 0.5, 2, 3), SubnetSpec(3, 0.75, 1, 5),
         SubnetSpec(4, 1.0, 2, 7)]


def _features(model: DreamDraft, seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 50, (1, 6), generator=gen)
    prev = torch.randn(1, 6, HIDDEN, generator=gen)
    pos = torch.arange(12, 18)[None]
    layer_hidden, visual, scores = tiny_prompt(num_visual=8)
    with torch.no_grad():
        memory = model.memory(layer_hidden, visual, scores)
        cache = DraftCache()
        first = model(ids[:, :5], prev[:, :5], pos[:, :5], memory, cache=cache).feature
        last = model(ids[:, 5:], prev[:, 5:], pos[:, 5:], memory, cache=cache).feature
    return model.logits(torch.cat((first, last), 1))


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: s.id)
def test_extracted_draft_equals_the_supernet_with_that_spec_active(spec):
    supernet = tiny_draft()
    with supernet.using(spec):
        expected = _features(supernet)
    compact = extract(supernet, spec)
    assert isinstance(compact, CompactDraft)
    assert compact.config.num_heads == spec.heads
    assert compact.config.inject_layers == (spec.inject_layer,)
    torch.testing.assert_close(_features(compact), expected)
    assert supernet.active == supernet.config.largest()  # extraction leaves the supernet as it was


def test_round_trip_without_the_supernet(tmp_path):
    spec = SPECS[1]
    compact = extract(tiny_draft(), spec)
    expected = _features(compact)
    compact.save_pretrained(tmp_path / "spec")
    assert {p.name for p in (tmp_path / "spec").iterdir()} == {"draft.safetensors", "config.json"}
    loaded = CompactDraft.from_pretrained(tmp_path / "spec", tiny_shared(0))
    assert loaded.spec == spec
    torch.testing.assert_close(_features(loaded), expected)
    with pytest.raises(InputError, match="cannot run"):
        loaded.set_active(SubnetSpec(1, 1.0, 2, 7))
    loaded.set_active(spec.replace(draft_len=2))  # draft_len is inference-only
    with pytest.raises(MissingArtefactError, match="no extracted draft"):
        CompactDraft.from_pretrained(tmp_path / "nothing")


def test_supernet_store_round_trip(tmp_path):
    model = tiny_draft()
    digest = save_supernet(model, tmp_path / "supernet")
    assert len(digest) == 16
    assert read_supernet_config(tmp_path / "supernet") == model.config
    loaded = load_supernet(tmp_path / "supernet", tiny_shared(0))
    with loaded.using(SPECS[2]), model.using(SPECS[2]):
        torch.testing.assert_close(_features(loaded), _features(model))


def test_parameter_count_and_step_time_shrink():
    counts = [sum(p.numel() for p in extract(tiny_draft(), s).parameters()) for s in SPECS]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    assert [extract(tiny_draft(), s).num_params() for s in SPECS] == counts
    # The work really shrinks (timings belong in benchmarks/, not in assertions): the
    # cross-attention memory holds only the kept visual tokens and only the kept heads.
    cfg = DraftConfig(hidden_size=64, num_heads=8, head_dim=8, intermediate_size=64,
                      vocab_size=50, inject_layers=(1,), num_target_layers=1)
    torch.manual_seed(0)
    big = DreamDraft(cfg, None)
    big.attach(_wide_shared())
    n_text, n_visual = 8, 400
    layer_hidden = torch.randn(1, n_text + n_visual, 64)
    visual = torch.zeros(1, n_text + n_visual, dtype=torch.bool)
    visual[:, n_text:] = True
    scores = torch.rand(1, n_text + n_visual)

    def memory_shape(spec: SubnetSpec) -> tuple[int, ...]:
        model = extract(big, spec)
        with torch.no_grad():
            return tuple(model.memory(layer_hidden, visual, scores).keys.shape)

    full = memory_shape(SubnetSpec(8, 1.0, 1, 1))
    quarter = memory_shape(SubnetSpec(8, 0.25, 1, 1))
    one_head = memory_shape(SubnetSpec(1, 1.0, 1, 1))
    assert math.prod(full) == 8 * (n_text + n_visual) * 8
    assert math.prod(quarter) == 8 * (n_text + n_visual // 4) * 8
    assert math.prod(one_head) == 1 * (n_text + n_visual) * 8


def _wide_shared():
    from dreams_nas.supernet.draft.state import SharedTargetModules
    from torch import nn

    return SharedTargetModules(nn.Embedding(50, 64), nn.Linear(64, 50, bias=False))


@pytest.mark.parametrize(("damage", "match"), [
    (lambda folder: (folder / "draft.safetensors").write_bytes(
        (folder / "draft.safetensors").read_bytes()[:-64]),
     r"draft\.safetensors is not a readable safetensors file, likely cut short"),
    (lambda folder: (folder / "config.json").write_text("{oops"),
     r"config\.json is not valid JSON \(line 1: "),
    (lambda folder: (folder / "config.json").write_text('{"kind": "dreams-nas-compact-draft"}'),
     r"config\.json is not a valid draft config \(the draft config lacks \['schema_version', "),
    (lambda folder: (folder / "config.json").write_text(json.dumps(
        {**json.loads((folder / "config.json").read_text()), "spec": None})),
     r"config\.json names no subnet \(spec\)"),
], ids=["truncated-weights", "cut-config", "empty-config", "no-spec"])
def test_a_damaged_spec_folder_is_one_line_naming_file_and_fix(tmp_path, damage, match):
    folder = tmp_path / "spec"
    extract(tiny_draft(), SPECS[1]).save_pretrained(folder)
    damage(folder)
    with pytest.raises(InputError, match=match) as info:
        CompactDraft.from_pretrained(folder, tiny_shared(0))
    message = str(info.value)
    assert "\n" not in message and str(folder) in message
    assert message.endswith("re-export the spec folder with `dreams-nas search` (it rewrites "
                            "specs/<spec_id>/)")
