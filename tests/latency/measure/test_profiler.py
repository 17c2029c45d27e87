from __future__ import annotations

import pytest
from _support.latency import ToyBuilder
from dreams_nas.latency.measure.hardware import detect_hardware
from dreams_nas.latency.measure.plan import build_plan
from dreams_nas.latency.measure.profile_store import ProfileStore
from dreams_nas.latency.measure.profiler import TimingSettings, run_profile
from dreams_nas.supernet.core.space import SearchSpace

SPACE = SearchSpace(heads=(2, 8), visual_keep=(0.5, 1.0), inject_layer=(1,), draft_len=(1, 3))
FAST = TimingSettings(warmup=1, min_repeats=2, repeats=3, budget_s=0.05, threads=1)


def test_an_oom_subnet_is_recorded_and_profiling_goes_on(tmp_path, caplog) -> None:
    keys = build_plan(SPACE, [24, 40], verify_ks=(2, 4))
    store = ProfileStore(tmp_path / "profile.csv")
    hw = detect_hardware("cpu", threads=1)
    with caplog.at_level("WARNING", logger="dreams_nas.latency"):
        result = run_profile(ToyBuilder(hidden=32, heads=8, visual_tokens=8, fail_heads=8), keys,
                             store, hw, FAST, show_progress=False)
    rows = store.read()
    assert result.measured == len(keys) == len(rows) and result.failed == 8  # draft + draft_first
    failed = rows[rows.status == "oom"]
    assert set(failed.heads) == {8} and failed.median_ms.isna().all()
    assert failed.error.str.contains("OutOfMemoryError").all()
    assert "oom" in caplog.text and "continuing" in caplog.text
    ok = store.ok_rows()
    assert len(ok) == len(keys) - 8 and (ok.n_samples >= 2).all()
    # resuming skips every recorded key, failed ones included
    again = run_profile(ToyBuilder(hidden=32, heads=8, visual_tokens=8), keys, store, hw, FAST,
                        show_progress=False)
    assert (again.measured, again.skipped) == (0, len(keys))


def test_programming_errors_are_not_swallowed(tmp_path) -> None:
    class Broken(ToyBuilder):
        def build(self, key):
            raise TypeError("a bug")

    with pytest.raises(TypeError, match="a bug"):
        run_profile(Broken(hidden=32), build_plan(SPACE, [24]), ProfileStore(tmp_path / "p.csv"),
                    detect_hardware("cpu", threads=1), FAST, show_progress=False)


def test_interleaved_passes_pool_their_samples(tmp_path) -> None:
    keys = build_plan(SPACE, [24, 40], verify_ks=(2,))
    store = ProfileStore(tmp_path / "profile.csv")
    settings = TimingSettings(warmup=1, min_repeats=3, repeats=6, budget_s=5.0, threads=1,
                              passes=3, chunk=4)
    result = run_profile(ToyBuilder(hidden=32, heads=8, visual_tokens=8, fail_heads=8), keys, store,
                         detect_hardware("cpu", threads=1), settings, show_progress=False)
    rows = store.read()
    assert result.measured == len(rows) == len(keys) and result.failed == 8
    ok = rows[rows.status == "ok"]
    assert (ok.n_samples == 6).all()  # 3 passes x 2 repeats, pooled into one row per key
    assert all(len(s.split()) == 6 for s in ok.samples_ms)


def test_whole_grid_interleaving_visits_every_step_once_per_pass(tmp_path) -> None:
    """chunk=0: one block, the whole grid; each pass visits every step once (in alternating
    order), so a step's samples span the whole profile; the rows are written together."""
    keys = build_plan(SPACE, [24, 40], verify_ks=(2,))
    visits = []

    class Recording(ToyBuilder):
        def build(self, key):
            visits.append(key.ident)
            return super().build(key)

    store = ProfileStore(tmp_path / "profile.csv")
    appends = []
    original = store.append
    store.append = lambda rows: appends.append(len(rows)) or original(rows)
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=4, budget_s=5.0, threads=1,
                              passes=2, chunk=0)
    run_profile(Recording(hidden=32, heads=8, visual_tokens=8), keys, store,
                detect_hardware("cpu", threads=1), settings, show_progress=False)
    assert appends == [len(keys)]
    n = len(keys)
    assert sorted(visits[:n]) == sorted(visits[n:]) == sorted(k.ident for k in keys)
    assert visits[n:] == visits[:n][::-1]  # the second pass runs backwards
    assert (store.ok_rows().n_samples == 4).all()


def test_the_repeats_split_over_the_passes_add_up() -> None:
    from dreams_nas.latency.measure.profiler import _part

    for total in range(1, 40):
        for parts in range(1, total + 1):
            shares = [_part(total, parts, p) for p in range(parts)]
            assert sum(shares) == total and max(shares) - min(shares) <= 1


class _Killed(Exception):
    """Stands in for a kill in the middle of a profile (raised by a builder)."""


def test_a_profile_killed_in_its_block_resumes_from_the_journaled_passes(tmp_path) -> None:
    """The whole grid is one block (chunk 0), written when its last pass ends; killed in
    the second pass, the rerun times only the passes the journal lacks, pools the journaled
    samples with the new ones, and removes the journal."""
    from dreams_nas.latency.measure.passes import journal_path

    keys = build_plan(SPACE, [24, 40], verify_ks=(2,))
    n = len(keys)
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=4, budget_s=5.0, threads=1,
                              passes=2, chunk=0)
    builds: list[tuple] = []

    class Dying(ToyBuilder):
        def __init__(self, die_at: int | None, **kw) -> None:
            super().__init__(**kw)
            self.die_at = die_at

        def build(self, key):
            if self.die_at is not None and len(builds) == self.die_at:
                raise _Killed
            builds.append(key.ident)
            return super().build(key)

    store = ProfileStore(tmp_path / "profile.csv")
    hw = detect_hardware("cpu", threads=1)
    journal = journal_path(store.path)
    with pytest.raises(_Killed):
        run_profile(Dying(n + 3, hidden=32, heads=8, visual_tokens=8), keys, store, hw, settings,
                    show_progress=False)
    assert not store.exists() and journal.is_file()
    assert len(journal.read_text().splitlines()) == n + 3  # every pass timed before the kill
    with journal.open("ab") as handle:
        handle.write(b'{"settings": {"torn')  # the kill also tore a line
    builds.clear()
    result = run_profile(Dying(None, hidden=32, heads=8, visual_tokens=8), keys, store, hw,
                         settings, show_progress=False)
    assert len(builds) == n - 3  # only the second pass's missing steps
    assert result.measured == n and (store.ok_rows().n_samples == 4).all()
    assert not journal.exists()


def test_journaled_passes_of_other_settings_are_timed_again(tmp_path) -> None:
    from dreams_nas.latency.measure.passes import PassJournal, journal_path
    from dreams_nas.latency.measure.timing import Timing

    keys = build_plan(SPACE, [24], verify_ks=(2,))
    store = ProfileStore(tmp_path / "profile.csv")
    settings = TimingSettings(warmup=1, min_repeats=2, repeats=4, budget_s=5.0, threads=1,
                              passes=2)
    other = PassJournal(journal_path(store.path), {**settings.signature(), "repeats": 8})
    for key in keys:
        other.add(key.ident, 0, Timing(samples_ms=(999.0,) * 4, warmup=1, throttled=False))
    run_profile(ToyBuilder(hidden=32, heads=8, visual_tokens=8), keys, store,
                detect_hardware("cpu", threads=1), settings, show_progress=False)
    rows = store.ok_rows()
    assert len(rows) == len(keys) and (rows.median_ms < 999.0).all()
