"""The lossless check judges each divergence by both runs' own logits, checks every divergence
and the logits of every shared context, in ulps of the dtype."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from dreams_nas.nas.stages import lossless
from dreams_nas.nas.stages.lossless import NotLossless, check_lossless, ulp

EOS = 99
ONE = 2.0**-4  # one bfloat16 ulp at a logit of 12 (2^3 x 2^-7)


def _rows(*scores: dict[int, float]) -> lossless._Rows:
    """Rows of logits over a vocabulary of 100: `scores` per row, every other token at 0."""
    rows = lossless._Rows()
    for row in scores:
        logits = torch.zeros(1, 100)
        for token, value in row.items():
            logits[0, token] = value
        rows.add(logits)
    return rows


def _row(top: int, other: int, gap: float, base: float = 12.0) -> dict[int, float]:
    return {top: base, other: base - gap}


@pytest.fixture
def scripted(monkeypatch):
    """check_lossless over scripted runs: `spec` is the speculative run (tokens, rows), `plain`
    maps a forced prefix (tuple) to plain decoding's (tokens, rows) after it."""
    runs: dict = {}
    monkeypatch.setattr(lossless, "_speculative", lambda *a, **k: runs["spec"])
    monkeypatch.setattr(lossless, "observe_plain", lambda target, prompt, n, prefix=():
                        lossless.Observed(*runs["plain"][tuple(prefix)]))

    def check(dtype: str = "bfloat16"):
        target = SimpleNamespace(dtype=getattr(torch, dtype), eos_token_ids={EOS})
        tokens, plain = runs["spec"][0], lossless.Observed(*runs["plain"][()])
        return check_lossless(target, {}, lambda: None, 3, max_new_tokens=len(tokens),
                              outputs=(tokens, plain), where=("h1-v1.00-l1-g3", 0))

    return runs, check


def test_units_in_the_last_place() -> None:
    assert ulp(12.0, "bfloat16") == ONE and ulp(-12.0, "bfloat16") == ONE
    assert ulp(0.3, "float16") == 2.0**-10  # at least the spacing at 1
    assert ulp(20.0, "float32") == 16 * 2.0**-23


def test_first_difference() -> None:
    assert lossless._first_difference([1, 2, 3], [1, 2, 3]) is None
    assert lossless._first_difference([1, 2, 4], [1, 2, 3]) == 2
    assert lossless._first_difference([1, 2], [1, 2, 3]) == 2  # one stopped early (an EOS)


def test_a_near_tie_both_runs_see_is_recorded(scripted) -> None:
    runs, check = scripted
    runs["spec"] = ([5, 7, 8], _rows(_row(5, 6, 3.0), _row(7, 6, ONE), _row(8, 1, 2.0)))
    runs["plain"] = {(): ([5, 6, 9], _rows(_row(5, 6, 3.0), _row(6, 7, ONE), _row(9, 1, 2.0))),
                     (5, 7): ([8], _rows(_row(8, 1, 2.0)))}
    checked = check()
    (tie,) = checked.divergences
    assert (tie.position, tie.margin, tie.spec_margin, tie.ulp) == (1, ONE, ONE, ONE)
    assert tie.tolerance == lossless.NEAR_TIE_ULPS["bfloat16"] * ONE
    assert checked.drift_ulps == 1.0  # the tied row: each token 1 ulp apart


def test_a_divergence_the_speculative_run_did_not_see_as_a_tie_is_refused(scripted) -> None:
    """Plain decoding's margin alone (a fresh prefill's, before) would call this a near tie:
    the verify logits preferred their token by 16 ulps, which numerics do not explain."""
    runs, check = scripted
    runs["spec"] = ([5, 7], _rows(_row(5, 6, 3.0), _row(7, 6, 16 * ONE)))
    runs["plain"] = {(): ([5, 6], _rows(_row(5, 6, 3.0), _row(6, 7, ONE)))}
    with pytest.raises(NotLossless, match=r"on prompt 0 at token 1: plain decoding preferred "
                                          r"its token by 0.0625, the speculative run its own "
                                          r"by 1 \(a near tie in bfloat16"):
        check()


def test_every_divergence_is_checked_not_only_the_first(scripted) -> None:
    runs, check = scripted
    runs["spec"] = ([5, 7, 8, 3], _rows(_row(5, 6, 3.0), _row(7, 6, ONE), _row(8, 1, 2.0),
                                        _row(3, 4, 2.0)))
    runs["plain"] = {(): ([5, 6, 9, 9], _rows(_row(5, 6, 3.0), _row(6, 7, ONE),
                                              _row(9, 1, 2.0), _row(9, 1, 2.0))),
                     (5, 7): ([8, 4], _rows(_row(8, 1, 2.0), _row(4, 3, 2.0)))}
    with pytest.raises(NotLossless, match="at token 3: plain decoding preferred its token by 2"):
        check()


def test_logits_that_moved_in_a_shared_context_are_refused(scripted) -> None:
    """Identical tokens, but the verify's logits are 12 ulps off plain decoding's: a stray KV
    row or a RoPE position off by one, caught before it changes a token."""
    runs, check = scripted
    runs["spec"] = ([5, 8], _rows(_row(5, 6, 3.0), _row(8, 1, 2.0, base=12.0 + 12 * ONE)))
    runs["plain"] = {(): ([5, 8], _rows(_row(5, 6, 3.0), _row(8, 1, 2.0)))}
    with pytest.raises(NotLossless, match=r"logits differ from plain decoding's on prompt 0 at "
                                          r"token 1 by 12.0 ulps of bfloat16 in the same context"):
        check()


def test_an_exact_float32_tie_broken_the_other_way_is_a_near_tie(scripted) -> None:
    runs, check = scripted
    runs["spec"] = ([5, 7], _rows(_row(5, 6, 3.0), {7: 12.0, 6: 12.0 - 2.0**-20}))
    runs["plain"] = {(): ([5, 6], _rows(_row(5, 6, 3.0), {6: 12.0, 7: 12.0}))}
    (tie,) = check("float32").divergences
    assert tie.margin == 0.0


def test_a_rerun_that_decodes_otherwise_is_an_error(scripted) -> None:
    runs, check = scripted
    runs["spec"] = ([5, 7], _rows(_row(5, 6, 3.0), _row(7, 6, ONE)))
    runs["plain"] = {(): ([5, 7], _rows(_row(5, 6, 3.0), _row(7, 6, ONE)))}
    target = SimpleNamespace(dtype=torch.bfloat16, eos_token_ids={EOS})
    plain = lossless.Observed(*runs["plain"][()])
    with pytest.raises(NotLossless, match="not deterministic"):
        check_lossless(target, {}, lambda: None, 3, max_new_tokens=2, outputs=([5, 6], plain),
                       where=("x", 0))


@pytest.mark.parametrize("fault", ["clean", "stray-kv", "rope+1"])
def test_injected_faults_are_caught_and_a_clean_run_passes(tiny_vlm, fault) -> None:
    """The real check on a real (tiny, float32) target, drafting with its own oracle: a stray
    KV row or a RoPE position off by one in one layer of the verify is refused even where no
    token changes; the loop as it is passes (benchmarks/bench_lossless_faults.py measures the
    built-in target in bfloat16)."""
    from _support.models import PROMPTS, tiny_image
    from bench_lossless_faults import FaultyTarget
    from dreams_nas.supernet.decoding.drafters import OracleDrafter
    from dreams_nas.supernet.decoding.loop import generate, plain_generate
    from dreams_nas.supernet.target.adapter import TargetAdapter

    model, processor = tiny_vlm("llava")
    target = TargetAdapter.from_model(model, processor)
    faulty = FaultyTarget(target, fault, layer=1)
    for index in range(1):
        prompt = target.build_inputs(tiny_image(index), PROMPTS[index])
        plain = plain_generate(target, dict(prompt), max_new_tokens=32).tokens.tolist()
        spec = generate(faulty, dict(prompt), OracleDrafter(), shape=4,
                        max_new_tokens=32).tokens.tolist()
        assert len(plain) == 32  # no EOS: the stray row lands (past the 2nd token) and is read

        observed = lossless.observe_plain(target, prompt, 32, expect=plain)

        def check(prompt=prompt, outputs=(spec, observed), index=index):
            return check_lossless(faulty, prompt, OracleDrafter, 4, max_new_tokens=32,
                                  outputs=outputs, where=(fault, index))

        if fault == "clean":
            assert check().drift_ulps <= lossless.NEAR_TIE_ULPS["float32"]
        else:
            with pytest.raises(NotLossless, match=rf"on prompt {index} at token"):
                check()
