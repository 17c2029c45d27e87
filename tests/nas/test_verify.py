"""The end-to-end verification of `dreams-nas search` shows its progress (it decodes every prompt
once per chosen subnet plus once plainly: minutes on a CPU) and stays silent when asked; with
several repeats its speedup is the median of the repeats' and decoding must repeat itself."""

from __future__ import annotations

import pytest
import torch
from dreams_nas.nas.stages.lossless import Checked, Observed
from dreams_nas.nas.stages.verify import measure_end_to_end
from dreams_nas.supernet.core.spec import SubnetSpec
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
    monkeypatch.setattr("dreams_nas.nas.stages.verify.check_lossless",  # test_lossless.py's
                        lambda *args, **kwargs: Checked([], 0.0))
    monkeypatch.setattr("dreams_nas.nas.stages.verify.observe_plain",
                        lambda *args, **kwargs: Observed([], None))


@pytest.mark.parametrize(("show", "shown"), [(True, True), (False, False)])
def test_the_verification_shows_a_bar_unless_told_not_to(fake_decoding, capsys, show,
                                                         shown) -> None:
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}] * 3
    rows = measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                              max_new_tokens=4, show_progress=show)
    assert len(rows) == 1 and rows[0].identical_prompts == 3
    err = capsys.readouterr().err
    assert ("verifying end to end" in err and "/3 " in err) is shown, err


def _timed(total_s: float, tokens: list[int] | None = None) -> GenerationResult:
    """A call of `total_s` seconds, 4 ms of it the prefill."""
    tokens = TOKENS if tokens is None else tokens
    stats = GenerationStats(new_tokens=len(tokens), target_forwards=3, cycle_lengths=(2, 2),
                            proposed=(2, 2), prefill_s=0.004, draft_s=0.002, verify_s=0.01,
                            other_s=0.001, total_s=total_s)
    return GenerationResult(tokens=torch.tensor(tokens), stats=stats)


def _scripted(monkeypatch, plain: list[GenerationResult], spec: list[GenerationResult]) -> None:
    """Plain decoding and the subnet return these results call after call (warm-ups first)."""
    plain_calls, spec_calls = iter(plain), iter(spec)
    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.plain_generate",
                        lambda *a, **k: next(plain_calls))
    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.generate",
                        lambda *a, **k: next(spec_calls))


def test_repeats_give_the_median_speedup_and_its_range(fake_decoding, monkeypatch) -> None:
    """Two prompts, three repeats; the subnet's decode phase (total - 4 ms prefill) takes a
    third, a half and a quarter of plain decoding's 36 ms: speedups 3, 2 and 4, median 3."""
    warm = [_timed(1.0)]
    plain = warm + [_timed(0.040)] * 6
    spec = warm + [_timed(0.016)] * 2 + [_timed(0.022)] * 2 + [_timed(0.013)] * 2
    _scripted(monkeypatch, plain, spec)
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}] * 2
    between = []  # the hook runs before each prompt of each pass and after the last
    (row,) = measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                                max_new_tokens=4, repeats=3, show_progress=False,
                                between=between.append)
    assert between == [0, 1, 2, 3, 4, 5, 6]
    assert row.repeat_speedups == pytest.approx((3.0, 2.0, 4.0))
    assert row.speedup == pytest.approx(3.0)
    assert row.speedup_range == pytest.approx((2.0, 4.0))
    assert row.speedup_end_to_end == pytest.approx(40 / 16)  # the median repeat's whole calls
    assert row.prompts == 2 and row.identical_prompts == 2


def test_one_repeat_keeps_the_pooled_speedup(fake_decoding, monkeypatch) -> None:
    _scripted(monkeypatch, [_timed(1.0), _timed(0.040), _timed(0.040)],
              [_timed(1.0), _timed(0.016), _timed(0.022)])
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}] * 2
    (row,) = measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                                max_new_tokens=4, show_progress=False)
    assert row.speedup == pytest.approx(72 / 30) and row.speedup_range == (row.speedup,) * 2


def test_a_repeat_that_decodes_differently_is_an_error(fake_decoding, monkeypatch) -> None:
    _scripted(monkeypatch, [_timed(1.0), _timed(0.04), _timed(0.04, [5, 6, 7, 9])],
              [_timed(1.0), _timed(0.02), _timed(0.02)])
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}]
    with pytest.raises(RuntimeError, match="plain decoding decoded prompt 0 differently on a "
                                           "repeat"):
        measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                           max_new_tokens=4, repeats=2, show_progress=False)


def test_the_warm_up_decodes_the_first_prompt_whole(fake_decoding, monkeypatch) -> None:
    """First-call work (a GPU's kernel choice for each context length and verify width) falls
    in the warm-up: one decode of the first prompt as long as the measured ones, per decoder."""
    lengths: list[tuple[str, int]] = []

    def plain(*args, max_new_tokens, **kwargs):
        lengths.append(("plain", max_new_tokens))
        return _timed(0.040)

    def spec(*args, max_new_tokens, **kwargs):
        lengths.append(("spec", max_new_tokens))
        return _timed(0.020)

    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.plain_generate", plain)
    monkeypatch.setattr("dreams_nas.supernet.decoding.loop.generate", spec)
    prompts = [{"input_ids": torch.ones(1, 3, dtype=torch.long)}] * 2
    measure_end_to_end(object(), object(), [SubnetSpec(2, 0.5, 2, 3)], prompts,
                       max_new_tokens=48, show_progress=False)
    assert lengths[:2] == [("plain", 48), ("spec", 48)]
    assert len(lengths) == 2 + 2 * len(prompts)
