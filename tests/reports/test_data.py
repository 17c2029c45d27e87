"""ReportData built from hand-made run folders: front membership, best subnet, metrics."""

from __future__ import annotations

import csv
import json
import shutil

import pytest
from dreams_nas.reports import (
    MissingResultsError,
    ReportError,
    build_report_data,
)

from .fixtures import (
    A10G,
    CPU,
    H100,
    SIZED_LAYER,
    VOCAB_HEADS,
    Space,
    front_ids,
    make_run,
    make_single_subnet_run,
    make_sized,
    make_vocab,
    read_rows,
)


@pytest.fixture
def cpu_run(tmp_path):
    return make_run(tmp_path / "run")


def test_front_and_best_match_the_search_files(cpu_run) -> None:
    data = build_report_data(cpu_run)
    search = cpu_run / "search" / CPU.hardware_id
    trials = read_rows(search / "trials.csv")
    pareto_ids = {r["spec_id"] for r in read_rows(search / "pareto.csv")}
    best = json.loads((search / "best.json").read_text())

    assert data.hardware_id == CPU.hardware_id
    assert len(data.subnets) == len(trials) == len(Space().specs())
    assert {s.spec_id for s in data.front} == pareto_ids
    assert all(s.on_front == (s.spec_id in pareto_ids) for s in data.subnets)
    # The front is listed best first.
    speedups = [s.speedup for s in data.front]
    assert speedups == sorted(speedups, reverse=True)
    assert data.best.spec_id == best["spec_id"] == max(
        trials, key=lambda r: float(r["speedup"]))["spec_id"]
    assert data.best_subnet is not None and data.best_subnet.on_front
    assert data.best.predicted_speedup == pytest.approx(best["predicted"]["speedup"])
    assert data.best.measured_speedup == pytest.approx(best["measured"]["speedup"])
    assert data.best.tau_ci == pytest.approx(tuple(best["predicted"]["tau_ci"]))
    assert data.best.verify_ms == pytest.approx(best["predicted"]["verify_ms"])
    assert data.best.exported


def test_subnet_metrics_are_read_as_written(cpu_run) -> None:
    data = build_report_data(cpu_run)
    row = read_rows(cpu_run / "search" / CPU.hardware_id / "trials.csv")[7]
    sub = next(s for s in data.subnets if s.spec_id == row["spec_id"])
    assert (sub.heads, sub.visual_keep, sub.inject_layer, sub.draft_len) == (
        int(row["heads"]), float(row["visual_keep"]), int(row["inject_layer"]),
        int(row["draft_len"]))
    assert sub.speedup == pytest.approx(float(row["speedup"]))
    assert sub.tau_lo < sub.tau < sub.tau_hi
    assert sub.cycle_draft_ms == pytest.approx(
        float(row["first_draft_ms"]) + (sub.draft_len - 1) * float(row["draft_ms"]))
    assert sub.draft_params == int(row["draft_params"])
    # speedup = τ·T_decode / (T_first_draft + (γ−1)·T_draft + T_verify), as the search has it.
    cycle_ms = float(row["first_draft_ms"]) + (sub.draft_len - 1) * sub.draft_ms + sub.verify_ms
    assert sub.speedup == pytest.approx(sub.tau * sub.decode_ms / cycle_ms, rel=1e-4)


def test_predictor_aifd_acceptance_and_verified(cpu_run) -> None:
    data = build_report_data(cpu_run)
    pred = json.loads((cpu_run / "latency" / CPU.hardware_id / "predictor.json").read_text())
    assert data.predictor.mape == pytest.approx(pred["metrics"]["mape"])
    assert data.predictor.kendall_tau == pytest.approx(pred["metrics"]["kendall_tau"])
    assert len(data.predictor.holdout) == pred["n_holdout"]
    # per kind, as predictor.json has them (a null metric reads as missing)
    by_kind = {k.kind: k for k in data.predictor.by_kind}
    assert set(by_kind) == set(pred["metrics_by_kind"]) == {"draft", "verify"}
    for kind, acc in by_kind.items():
        assert acc.n == pred["metrics_by_kind"][kind]["n"] == sum(
            p["kind"] == kind for p in pred["holdout"])
        assert acc.mape == pytest.approx(pred["metrics_by_kind"][kind]["mape"])
    assert by_kind["verify"].kendall_tau is None and by_kind["draft"].kendall_tau == 0.9
    from dreams_nas.reports.diagnostic_figures import kind_line

    assert kind_line(by_kind["verify"]).startswith(f"verify ({by_kind['verify'].n}): MAPE ")
    assert "τ" not in kind_line(by_kind["verify"]) and "τ 0.90" in kind_line(by_kind["draft"])
    assert data.aifd.chosen == (12,) and len(data.aifd.ae) == len(data.aifd.layers) == 16
    assert data.aifd.delta_ae[0] == 0.0
    # One acceptance curve per front subnet, as long as its draft_len, decreasing with position.
    assert data.acceptance_dataset == "builtin-eval"
    assert [c.spec_id for c in data.acceptance] == [s.spec_id for s in data.front]
    for curve, sub in zip(data.acceptance, data.front, strict=True):
        assert len(curve.rates) == sub.draft_len
        assert list(curve.rates) == sorted(curve.rates, reverse=True)
    best = json.loads((cpu_run / "search" / CPU.hardware_id / "best.json").read_text())
    assert [v.spec_id for v in data.verified] == [v["spec_id"] for v in best["verified"]]
    assert data.history == ()  # exhaustive search: no Optuna history
    assert data.cross_hardware is None
    assert data.hardware["name"] == CPU.name
    assert data.target["id"] == "builtin"


def test_optuna_history_and_unscored_trials(tmp_path) -> None:
    run = make_run(tmp_path / "run", optuna=True)
    data = build_report_data(run)
    rows = read_rows(run / "search" / CPU.hardware_id / "history.csv")
    assert len(data.history) == len(rows)
    best_so_far = [p.best_so_far for p in data.history]
    assert best_so_far == sorted(best_so_far)
    assert best_so_far[-1] == pytest.approx(data.best.predicted_speedup)
    # A trial without a score (NaN, written as empty cells) is not a subnet of the report.
    trials = read_rows(run / "search" / CPU.hardware_id / "trials.csv")
    assert any(r["speedup"] == "" for r in trials)
    assert len(data.subnets) == len({r["spec_id"] for r in trials if r["speedup"] != ""})


def test_single_subnet_run(tmp_path) -> None:
    data = build_report_data(make_single_subnet_run(tmp_path / "run"))
    assert len(data.subnets) == 1 and data.front == data.subnets
    assert data.best.spec_id == "h4-v0.50-l12-g3" == data.front[0].spec_id
    assert data.predictor is None and data.aifd is None and data.history == ()


def test_several_hardware_ids(tmp_path) -> None:
    run = make_run(tmp_path / "run", hardware=(CPU, H100, A10G))
    data = build_report_data(run)
    # Default: the latest search (H100's best.json is the newest).
    assert data.hardware_id == H100.hardware_id
    cross = data.cross_hardware
    assert cross.hardware_ids == tuple(sorted(h.hardware_id for h in (CPU, H100, A10G)))
    bests = {}
    for hw in (CPU, H100, A10G):
        bests[hw.hardware_id] = json.loads(
            (run / "search" / hw.hardware_id / "best.json").read_text())["spec_id"]
    assert cross.best_spec_ids == tuple(bests[h] for h in cross.hardware_ids)
    assert len(set(cross.best_spec_ids)) > 1, "the fixture's machines should disagree"
    for i, row_hw in enumerate(cross.hardware_ids):
        for j, col_hw in enumerate(cross.hardware_ids):
            trials = {r["spec_id"]: float(r["speedup"])
                      for r in read_rows(run / "search" / col_hw / "trials.csv")}
            assert cross.speedup[i][j] == pytest.approx(trials[bests[row_hw]])
        # Each machine's own best beats the other machines' bests on it.
        col = [cross.speedup[k][i] for k in range(len(cross.hardware_ids))]
        assert max(col) == cross.speedup[i][i]
    other = build_report_data(run, hardware_id=CPU.hardware_id)
    assert other.hardware_id == CPU.hardware_id and other.best.spec_id == bests[CPU.hardware_id]


def test_cross_hardware_marks_subnets_not_evaluated(tmp_path) -> None:
    run = make_run(tmp_path / "run", hardware=(CPU, H100), optuna=True)
    cross = build_report_data(run).cross_hardware
    for i, sid in enumerate(cross.best_spec_ids):
        for j, hw in enumerate(cross.hardware_ids):
            ids = {r["spec_id"] for r in read_rows(run / "search" / hw / "trials.csv")
                   if r["speedup"] != ""}
            assert (cross.speedup[i][j] is None) == (sid not in ids)


def test_tolerates_missing_optional_parts_and_extra_columns(tmp_path) -> None:
    run = make_run(tmp_path / "run", aifd=False, predictor=False, measured=False,
                   acceptance=False, extra_columns=True)
    (run / "run.json").unlink()
    shutil.rmtree(run / "specs")
    data = build_report_data(run)
    assert data.best.measured_speedup is None and data.verified == ()
    assert data.acceptance == () and data.predictor is None and data.aifd is None
    assert data.target == {} and not data.best.exported
    assert {s.spec_id for s in data.front} == front_ids(
        [{**r, "speedup": float(r["speedup"]), "draft_params": int(r["draft_params"]),
          "feasible": int(r["feasible"])}
         for r in read_rows(run / "search" / CPU.hardware_id / "trials.csv")])


def _cell(line: bytes, at: int, value: bytes) -> bytes:
    """`line` (a CSV row) with its cell `at` replaced by `value`."""
    cells = line.split(b",")
    return b",".join([*cells[:at], value, *cells[at + 1:]])


def test_a_trials_csv_cut_short_is_refused_not_read_in_part(cpu_run) -> None:
    """The search rewrites trials.csv whole (atomically): a row cut short is damage. A torn last
    line was skipped and a report of the other subnets exited 0 (issue #48)."""
    trials = cpu_run / "search" / CPU.hardware_id / "trials.csv"
    data = trials.read_bytes()
    lines = data.splitlines(keepends=True)
    refused = {
        "mid-row": (data[:-20], r"trials\.csv ends mid-row \(its last line has no newline\): "
                                r"it was cut short; rerun `dreams-nas search`"),
        "missing cells": (b"".join([*lines[:3], lines[3].rsplit(b",", 4)[0] + b"\r\n",
                                    *lines[4:]]),
                          r"trials\.csv, line 4: 17 field\(s\) where the header has 21"),
        "a row dropped": (b"".join(lines[:-1]), r"trials\.csv holds 191 trial row\(s\) where "
                                                r".*best\.json counts 192 evaluated subnets"),
        "header only": (lines[0], r"trials\.csv holds 0 trial row\(s\) where .*best\.json "
                                  r"counts 192"),
        "a text number": (b"".join([*lines[:5], _cell(lines[5], 6, b"fast"), *lines[6:]]),
                          r"trials\.csv, line 6: tau 'fast' is not a finite number; the file is "
                          r"damaged"),
    }
    for why, (damaged, message) in refused.items():
        trials.write_bytes(damaged)
        with pytest.raises(ReportError, match=message) as err:
            build_report_data(cpu_run)
        assert "\n" not in str(err.value), why


def test_missing_search_results_name_the_file_and_the_command(tmp_path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(MissingResultsError,
                       match=r"search/<hardware-id>/trials\.csv; run `dreams-nas search`"):
        build_report_data(run)
    with pytest.raises(MissingResultsError, match="does not exist"):
        build_report_data(tmp_path / "nowhere")
    make_run(run)
    (run / "search" / CPU.hardware_id / "best.json").unlink()
    with pytest.raises(MissingResultsError, match=r"best\.json; run `dreams-nas search`"):
        build_report_data(run)


def test_unknown_hardware_id_lists_the_searched_ones(cpu_run) -> None:
    with pytest.raises(MissingResultsError, match=rf"'gpu-x'.*searched: {CPU.hardware_id}"):
        build_report_data(cpu_run, hardware_id="gpu-x")


def test_bad_files_say_which_and_what_to_do(cpu_run) -> None:
    best = cpu_run / "search" / CPU.hardware_id / "best.json"
    best.write_text("{not json")
    with pytest.raises(ReportError, match=r"best\.json is not valid JSON"):
        build_report_data(cpu_run)


def test_a_pareto_csv_that_is_not_the_front_of_trials_csv_is_refused(cpu_run) -> None:
    """report read whichever ids pareto.csv listed: a broken one showed another front with exit
    0 (issue #48). It must be exactly the front of trials.csv in best.json's pair, of subnets
    trials.csv holds, whose fields make their ids."""
    search = cpu_run / "search" / CPU.hardware_id
    pareto, trials = search / "pareto.csv", search / "trials.csv"
    data, rows = pareto.read_bytes(), trials.read_bytes().splitlines(keepends=True)
    lines = data.splitlines(keepends=True)
    front = {r["spec_id"] for r in read_rows(pareto)}
    off = next(line for line in rows[1:] if line.split(b",")[1].decode() not in front)
    on = next(i for i, line in enumerate(rows) if line.split(b",")[1].decode() in front)
    pair = r"pareto\.csv is not the front of .*trials\.csv \(maximising speedup, minimising " \
           r"draft_params\): it lacks "
    refused = {
        "a front row dropped": (pareto, data[: -len(lines[-1])], pair + r"h\S+ and lists none"),
        "a row off the front": (pareto, data + off, pair + r"none and lists h\S+ off it"),
        "an unknown subnet": (pareto, data + _cell(lines[1], 1, b"h9-v0.50-l4-g1"),
                              r"pareto\.csv lists h9-v0\.50-l4-g1, not among the scored "
                              r"subnets of .*trials\.csv"),
        "cut mid-row": (pareto, data[:-5], r"pareto\.csv ends mid-row"),
        "a front row renamed": (trials, b"".join([*rows[:on], _cell(rows[on], 3, b"0.75"),
                                                  *rows[on + 1:]]),
                                r"trials\.csv: the trial named h\S+ has the fields of h\S+-v0\.75"),
    }
    for why, (path, damaged, message) in refused.items():
        before = path.read_bytes()
        path.write_bytes(damaged)
        with pytest.raises(ReportError, match=message) as err:
            build_report_data(cpu_run)
        assert "\n" not in str(err.value), why
        path.write_bytes(before)
    pareto.write_bytes(data + lines[1])  # a row listed twice: the same front
    assert {s.spec_id for s in build_report_data(cpu_run).front} == front


def test_missing_pareto_csv_names_the_file_and_the_command(cpu_run) -> None:
    (cpu_run / "search" / CPU.hardware_id / "pareto.csv").unlink()
    with pytest.raises(MissingResultsError, match=r"pareto\.csv; run `dreams-nas search`"):
        build_report_data(cpu_run)


def test_missing_fields_are_named_not_filled_in(cpu_run) -> None:
    search = cpu_run / "search" / CPU.hardware_id
    best = json.loads((search / "best.json").read_text())
    del best["spec"]["heads"], best["predicted"]["speedup"]
    (search / "best.json").write_text(json.dumps(best))
    lacks = r"best\.json lacks \['spec\.heads', 'predicted\.speedup'\]; rerun `dreams-nas search`"
    with pytest.raises(ReportError, match=lacks):
        build_report_data(cpu_run)
    rows = read_rows(search / "trials.csv")
    columns = [c for c in rows[0] if c != "feasible"]
    with (search / "trials.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    with pytest.raises(ReportError, match=r"trials\.csv lacks the column\(s\) \['feasible'\]"):
        build_report_data(cpu_run)


def test_infeasible_subnets_are_kept_but_never_front_or_best(tmp_path) -> None:
    # --max-draft-ms 11: the 8-head subnets (and some 6-head ones) break the constraint.
    run = make_run(tmp_path / "run", max_draft_ms=11.0)
    data = build_report_data(run)
    infeasible = {s.spec_id for s in data.subnets if not s.feasible}
    assert infeasible and len(data.subnets) == len(Space().specs())
    assert all(s.draft_ms > 11.0 for s in data.subnets if not s.feasible)
    assert not infeasible & {s.spec_id for s in data.front}
    assert data.best.spec_id not in infeasible


def test_subnet_table_reads_as_the_subnets_it_holds(cpu_run) -> None:
    from dreams_nas.reports import SubnetTable

    subnets = build_report_data(cpu_run).subnets
    assert isinstance(subnets, tuple)
    table = SubnetTable.of(subnets)
    assert len(table) == len(subnets)
    assert tuple(table) == subnets and table[:5] == subnets[:5]
    assert table[-1] == subnets[-1] and table.take([3, 1]) == (subnets[3], subnets[1])
    assert table.index_of(subnets[7].spec_id) == 7 and table.index_of("h0-v0.00-l0-g0") is None
    assert list(table.cycle_draft_ms) == pytest.approx([s.cycle_draft_ms for s in subnets])
    with pytest.raises(IndexError):
        table[len(subnets)]


def test_trials_written_before_depth_and_mlp_read_as_the_papers_size(cpu_run) -> None:
    trials = cpu_run / "search" / CPU.hardware_id / "trials.csv"
    assert "depth" not in read_rows(trials)[0]  # the fixture writes the old header
    data = build_report_data(cpu_run)
    assert {(s.depth, s.mlp, s.draft_vocab) for s in data.subnets} == {(1, 1.0, 1.0)}
    assert (data.best.depth, data.best.mlp, data.best.draft_vocab) == (1, 1.0, 1.0)
    assert not data.columns.is_elastic_size and not data.columns.is_draft_vocab


def test_depth_and_mlp_are_read_from_trials_and_best_json(cpu_run) -> None:
    run = make_sized(cpu_run)
    search = run / "search" / CPU.hardware_id
    rows = read_rows(search / "trials.csv")
    assert list(rows[0])[5:8] == ["draft_len", "depth", "mlp"]
    data = build_report_data(run)
    by_id = {s.spec_id: s for s in data.subnets}
    for row in rows:
        sub = by_id[row["spec_id"]]
        assert (sub.depth, sub.mlp) == (int(row["depth"]), float(row["mlp"]))
        assert (sub.depth, sub.mlp) == ((2, 0.5) if sub.inject_layer == SIZED_LAYER else (1, 1.0))
    assert data.columns.is_elastic_size
    assert data.columns.depth.dtype.kind == "i" and data.columns.mlp.dtype.kind == "f"
    best = json.loads((search / "best.json").read_text())
    assert (data.best.depth, data.best.mlp) == (best["spec"].get("depth", 1),
                                               best["spec"].get("mlp", 1.0))
    assert data.best_subnet is not None and data.best_subnet.depth == data.best.depth
    # an empty cell reads as the paper's size too
    for row in rows:
        if row["depth"] == "1":
            row["depth"] = row["mlp"] = ""
    with (search / "trials.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert {(s.depth, s.mlp) for s in build_report_data(run).subnets} == {(1, 1.0), (2, 0.5)}


def test_the_draft_vocab_is_read_from_trials_and_best_json(cpu_run) -> None:
    run = make_vocab(make_sized(cpu_run))
    search = run / "search" / CPU.hardware_id
    rows = read_rows(search / "trials.csv")
    assert list(rows[0])[5:9] == ["draft_len", "depth", "mlp", "draft_vocab"]
    data = build_report_data(run)
    by_id = {s.spec_id: s for s in data.subnets}
    assert len(by_id) == len({r["spec_id"] for r in rows})
    for row in rows:
        sub = by_id[row["spec_id"]]
        assert sub.draft_vocab == float(row["draft_vocab"])
        assert sub.draft_vocab == (0.25 if sub.heads == VOCAB_HEADS else 1.0)
        assert (sub.depth, sub.mlp) == ((2, 0.5) if sub.inject_layer == SIZED_LAYER else (1, 1.0))
    assert data.columns.is_draft_vocab and data.columns.is_elastic_size
    assert data.columns.draft_vocab.dtype.kind == "f"
    best = json.loads((search / "best.json").read_text())
    assert data.best.draft_vocab == best["spec"].get("draft_vocab", 1.0)
    assert data.best_subnet is not None
    assert data.best_subnet.draft_vocab == data.best.draft_vocab
    # an empty cell reads as the whole vocabulary; so does a file without the column
    for row in rows:
        if row["draft_vocab"] == "1.0":
            row["draft_vocab"] = ""
    with (search / "trials.csv").open("w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    assert {s.draft_vocab for s in build_report_data(run).subnets} == {0.25, 1.0}
    sized = make_sized(make_run(run.parent / "sized", hardware=(CPU,)))
    assert "draft_vocab" not in read_rows(sized / "search" / CPU.hardware_id / "trials.csv")[0]
    assert {s.draft_vocab for s in build_report_data(sized).subnets} == {1.0}


def test_a_measurement_over_repeats_shows_its_median_and_range(cpu_run, tmp_path) -> None:
    """best.json of a search verified over three passes: the card names the median and the
    passes' range; one written before repeats has neither and shows no such row."""
    from dreams_nas.reports import render_report

    path = cpu_run / "search" / CPU.hardware_id / "best.json"
    plain = render_report(build_report_data(cpu_run), tmp_path / "plain.html").read_text()
    assert "median of" not in plain
    best = json.loads(path.read_text())
    best["measured"].update(speedup=2.41, speedup_range=[2.32, 2.45], repeats=3)
    path.write_text(json.dumps(best))
    data = build_report_data(cpu_run)
    assert data.best.measured_range == (2.32, 2.45) and data.best.measured_repeats == 3
    page = render_report(data, tmp_path / "repeats.html").read_text()
    assert "median of 3 passes, range" in page and "2.32–2.45×" in page
