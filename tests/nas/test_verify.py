"""The end-to-end verification of `dreams-nas search` shows its progress (it decodes every prompt
once per chosen subnet plus once plainly: minutes on a CPU) and stays silent when asked."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.nas.stages.verify import measure_end_to_end
from dreams_nas.supernet.core.space import SubnetSpec
from dreams_nas.supernet.decoding.loop import GenerationResult, GenerationStats

TOKENS = [5, 6, 7, 8]


def _result(*_args, **_kwargs) -> GenerationResult:
    """The same four tokens for plain and speculative decoding (lossless), in fixed times."""
    stats = GenerationStats(new_tokens=len(TOKENS), target_forwards=3, cycle_lengths=(2, 2),
                            proposed=(2, 2), prefill_s=0.004, draft_s=0.002, verify_s=0.01,
                            other_s=0.001, total_s=0.02)
    return GenerationResult(tokens=torch.tensor(TOKENS), stats=stats)


@pytest.fixture
def fake_decoding(monkeypatch):
    """measure_end_to_end's decoders replaced by fixed results: only its own loop runs."""
    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.generate", _result)
    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.plain_generate", _result)
    monkeypatch.setattr("dreams_nas.supernet.draft.extract.extract", lambda supernet, spec: None)
    monkeypatch.setattr("dreams_nas.supernet.decoding.dream.DreamDrafter",
                        lambda draft, spec: None)


@pytest.mark.parametrize(("show", "shown"), [(True, True), (False, False)])
def test_the_verification_shows_a_bar_unless_told_not_to(fake_decoding, capsys, show,
                                                         shown) -> None:
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}] * 3
    rows = measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                              max_new_tokens=4, show_progress=show)
    assert len(rows) == 1 and rows[0].identical_prompts == 3
    err = capsys.readouterr().err
    assert ("verifying end to end" in err and "/3 " in err) is shown, err
