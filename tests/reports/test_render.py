"""The rendered page and figure files, checked without a browser (see test_browser.py for one).

Rendering is the slow part, so each kind of run is rendered once per module and the tests read
the result.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from dreams_nas.reports import (
    RenderedFigure,
    ReportData,
    ReportError,
    build_report_data,
    figure_folder,
    render_figures,
    render_report,
    write_report,
)
from dreams_nas.reports.figures import save_figures
from matplotlib.figure import Figure

from .fixtures import A10G, CPU, H100, make_run, make_single_subnet_run

ALWAYS = {"pareto_latency", "pareto_params", "pareto_memory", "tau_cost", "training"}
KINDS = {
    "exhaustive": ({}, ALWAYS | {"acceptance", "verified", "parity", "aifd"}),
    "optuna-3hw": ({"optuna": True, "hardware": (CPU, H100, A10G)},
                   ALWAYS | {"acceptance", "verified", "parity", "aifd", "history",
                             "cross_hardware", "cross_front"}),
    "bare": ({"aifd": False, "predictor": False, "measured": False, "acceptance": False}, ALWAYS),
}


@pytest.fixture(scope="module")
def rendered(tmp_path_factory) -> dict[str, tuple[Path, str, ReportData]]:
    """kind -> (run folder, page text, its ReportData)."""
    out = {}
    for kind, (kwargs, _) in KINDS.items():
        run = make_run(tmp_path_factory.mktemp(kind) / "run", **kwargs)
        page = write_report(run)
        assert page == run / "report.html"
        out[kind] = (run, page.read_text(encoding="utf-8"), build_report_data(run))
    return out


def _figure_names(page: str) -> list[str]:
    return re.findall(r'<svg class="fig" role="img" data-figure="([a-z_]+)"', page)


@pytest.mark.parametrize("kind", list(KINDS))
def test_page_holds_the_figures_the_run_has_data_for(rendered, kind) -> None:
    run, page, _ = rendered[kind]
    expected = KINDS[kind][1]
    names = _figure_names(page)
    assert set(names) == expected and len(names) == len(expected)
    # Static copies beside the page, one SVG and one PNG per figure.
    folder = figure_folder(run / "report.html")
    assert folder == run / "report_figures"
    for name in expected:
        assert (folder / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (folder / f"{name}.svg").read_text().lstrip().startswith("<?xml")
    assert {p.stem for p in folder.iterdir()} == expected


@pytest.mark.parametrize("kind", list(KINDS))
def test_page_is_self_contained(rendered, kind) -> None:
    page = rendered[kind][1]
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "<script src" not in page and "@import" not in page and "url(http" not in page
    assert "@font-face" not in page
    # Element ids are unique across the inline SVGs (prefixed per figure), and every
    # internal reference points at an id of the page.
    ids = re.findall(r'\sid="([^"]+)"', page)
    assert len(ids) == len(set(ids))
    refs = set(re.findall(r'href="#([^"]+)"', page)) | set(re.findall(r"url\(#([^)]+)\)", page))
    assert refs <= set(ids)


def test_best_card_and_front_table(rendered) -> None:
    run, page, data = rendered["exhaustive"]
    card = page[page.index('id="best"'):page.index("</pre>", page.index('id="best"'))]
    assert data.best.spec_id in card
    assert f"{data.best.predicted_speedup:.2f}×" in card
    assert f"{data.best.measured_speedup:.2f}×" in card
    lo, hi = data.best.tau_ci
    assert f"[{lo:.2f}, {hi:.2f}]" in card
    assert f"{data.best.draft_ms:.2f} ms" in card and f"{data.best.verify_ms:.2f} ms" in card
    start = page.index('id="front-table"')
    table = page[start:page.index("</table>", start)]
    rows = re.findall(r'<tr[^>]*data-spec="([^"]+)"', table)
    assert rows == [s.spec_id for s in data.front]
    assert re.search(rf'<tr class=best data-spec="{re.escape(data.best.spec_id)}"', table)
    for sid in rows:
        assert f"dreams-nas generate --drafter {run}/specs/{sid} " in table
    assert CPU.name in page and data.supernet_hash in page and "transformers 5.24.0" in page


def test_cross_hardware_table(rendered) -> None:
    _, page, data = rendered["optuna-3hw"]
    start = page.index('id="cross-table"')
    table = page[start:page.index("</table>", start)]
    for hw, sid in zip(data.cross_hardware.hardware_ids, data.cross_hardware.best_spec_ids,
                       strict=True):
        assert f">{hw}</td>" in table and f">{sid}</td>" in table
    exhaustive_page = rendered["exhaustive"][1]
    assert "cross_table" not in exhaustive_page and 'id="cross-table"' not in exhaustive_page


def test_single_subnet_run_renders_and_is_deterministic(tmp_path) -> None:
    data = build_report_data(make_single_subnet_run(tmp_path / "run"))
    figures = render_figures(data)
    assert {f.name for f in figures} >= {"pareto_latency", "tau_cost"}
    assert [f.svg for f in render_figures(data)] == [f.svg for f in figures]
    page = render_report(data, tmp_path / "out" / "one.html").read_text(encoding="utf-8")
    assert "Pareto front (1 of 1 subnet)" in page


def test_stale_figure_copies_are_removed(tmp_path) -> None:
    def tiny(name: str) -> RenderedFigure:
        return RenderedFigure(name, name, "", "<svg></svg>", "<?xml version='1.0'?><svg/>",
                              Figure(figsize=(1, 1)))

    save_figures([tiny("pareto_latency"), tiny("history")], tmp_path, dpi=20)
    assert (tmp_path / "history.svg").is_file() and (tmp_path / "history.png").is_file()
    (tmp_path / "notes.txt").write_text("a file of the user's")
    save_figures([tiny("pareto_latency")], tmp_path, dpi=20)
    assert not (tmp_path / "history.svg").exists() and not (tmp_path / "history.png").exists()
    assert (tmp_path / "pareto_latency.png").is_file() and (tmp_path / "notes.txt").is_file()


def test_out_must_be_html(rendered, tmp_path) -> None:
    with pytest.raises(ReportError, match=r"must end in \.html"):
        render_report(rendered["bare"][2], tmp_path / "report.pdf")


def test_a_large_search_is_drawn_as_a_density_around_its_front(tmp_path) -> None:
    from dreams_nas.reports.plotting import DENSE_ABOVE

    from .fixtures import Space

    space = Space(heads=(1, 2, 3, 4, 5, 6, 7, 8), visual_keep=(0.25, 0.375, 0.5, 0.625, 0.75, 1.0),
                  inject_layer=(2, 4, 6, 8, 10, 12, 14, 16), draft_len=(1, 2, 3, 4, 5, 6, 7, 8))
    assert len(space.specs()) > DENSE_ABOVE
    run = make_run(tmp_path / "run", space=space, aifd=False, acceptance=False)
    page = write_report(run).read_text(encoding="utf-8")
    data = build_report_data(run)
    assert len(data.subnets) == len(space.specs()) and data.front
    figure = page.split('data-figure="pareto_latency"', 1)[1].split("</svg>", 1)[0]
    assert "subnets per cell" in figure  # the density's colour bar, not thousands of points
    assert len(page.encode()) < 800_000  # 1.3 MB when every subnet was a point


def test_a_search_of_50k_subnets_keeps_its_page_small(tmp_path) -> None:
    from dreams_nas.reports import SubnetTable
    from dreams_nas.reports.data import OBJECTS_UP_TO

    from .fixtures import Space, read_rows

    # 16 heads x 20 visual_keep x 16 layers x 10 draft_lens = 51,200 subnets
    space = Space(heads=tuple(range(1, 17)), visual_keep=tuple(i / 20 for i in range(1, 21)),
                  inject_layer=tuple(range(1, 17)), draft_len=tuple(range(1, 11)))
    n = len(space.specs())
    assert n > OBJECTS_UP_TO
    run = make_run(tmp_path / "run", space=space, aifd=False, acceptance=False,
                   predictor=False, measured=False)
    page = write_report(run).read_text(encoding="utf-8")
    data = build_report_data(run)
    # Read as columns, not as 51,200 objects; the front is the search's.
    assert isinstance(data.subnets, SubnetTable) and len(data.subnets) == n
    pareto = {r["spec_id"] for r in read_rows(run / "search" / CPU.hardware_id / "pareto.csv")}
    assert {s.spec_id for s in data.front} == pareto and 0 < len(pareto) < 50
    assert data.best_subnet is not None and data.best_subnet.spec_id == data.best.spec_id
    assert f"{n} subnets, front {len(pareto)}" in page
    # The page lists the front, never every subnet.
    assert len(re.findall(r"<tr[^>]*data-spec=", page)) == len(pareto)
    # Each subnet figure: the front as points, the rest as a density of at most a few thousand
    # hexagons; one element per subnet would be over 51,200.
    for name in ("pareto_latency", "pareto_params", "tau_cost"):
        figure = page.split(f'data-figure="{name}"', 1)[1].split("</svg>", 1)[0]
        assert "subnets per cell" in figure, name
        assert figure.count("<use") + figure.count("<path") < 6_000, name
    assert len(page.encode()) < 1_500_000


def test_the_cross_hardware_front_pairs_every_subnet_of_both_machines(rendered) -> None:
    import numpy as np
    from dreams_nas.supernet.core.pareto import is_pareto_front

    _, _, data = rendered["optuna-3hw"]
    paired = data.paired
    assert paired is not None and paired.other_id != data.hardware_id
    here = {s.spec_id: s.speedup for s in data.subnets}
    assert set(paired.spec_id) <= set(here)
    assert [here[i] for i in paired.spec_id] == paired.here.tolist()
    on = is_pareto_front(np.column_stack([paired.here, paired.there]), ("maximize", "maximize"))
    for i in range(len(on)):  # on the front iff no subnet is at least as fast on both
        x, y = paired.here[i], paired.there[i]
        beaten = ((paired.here >= x) & (paired.there >= y)
                  & ((paired.here > x) | (paired.there > y))).any()
        assert on[i] == (not beaten)
    _, _, bare = rendered["bare"]
    assert bare.paired is None  # one machine: no such figure


def test_a_search_written_before_memory_was_estimated_has_no_memory_figure(tmp_path) -> None:
    import csv

    run = make_run(tmp_path / "run")
    for path in (run / "search").glob("*/trials.csv"):
        rows = list(csv.DictReader(path.open()))
        with path.open("w", newline="") as handle:
            names = [c for c in rows[0] if c not in ("draft_bytes", "cycle_ms")]
            writer = csv.DictWriter(handle, fieldnames=names, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)
    data = build_report_data(run)
    assert all(s.draft_bytes is None for s in data.subnets)
    names = {f.name for f in render_figures(data)}
    assert "pareto_memory" not in names and "tau_cost" in names


def test_chains_and_trees_are_told_apart_on_the_front(tmp_path) -> None:
    import numpy as np
    import pandas as pd

    run = make_run(tmp_path / "run")
    trials = next(run.glob("search/*/trials.csv"))
    frame = pd.read_csv(trials, dtype={"spec_id": str})
    tree = frame["draft_len"] == 3  # these subnets now draft the tree 3x1x1 (3 levels)
    assert tree.any()
    frame["tree"] = np.where(tree, "3x1x1", "")
    frame.loc[tree, "spec_id"] = frame.loc[tree, "spec_id"].str.replace("-g3", "-t3x1x1")
    frame["cycle_ms"] = (frame["first_draft_ms"] + (frame["draft_len"] - 1) * frame["draft_ms"]
                         + frame["verify_ms"])
    frame.loc[tree, "cycle_ms"] += 0.5  # a 3-wide level costs more than a chain's step
    frame.to_csv(trials, index=False)
    # pareto.csv and best.json name the same subnets (the report checks them against trials.csv)
    pareto = pd.read_csv(trials.with_name("pareto.csv"), dtype={"spec_id": str})
    pareto["spec_id"] = pareto["spec_id"].str.replace("-g3", "-t3x1x1")
    pareto.to_csv(trials.with_name("pareto.csv"), index=False)
    best = json.loads(trials.with_name("best.json").read_text())
    if best["spec_id"].endswith("-g3"):
        best.update(spec_id=best["spec_id"].replace("-g3", "-t3x1x1"),
                    spec={**best["spec"], "tree": "3x1x1"})
    trials.with_name("best.json").write_text(json.dumps(best))
    data = build_report_data(run)
    table = data.columns
    assert table.is_tree.sum() == tree.sum()
    np.testing.assert_allclose(table.cycle_ms, table.recorded_cycle_ms)
    page = write_report(run).read_text(encoding="utf-8")
    note = page.split('id="shapes">', 1)[1].split("</p>", 1)[0]
    assert "best chain:" in note and "best tree:" in note and "-t3x1x1" in note
    assert ("tree 3x1x1" in page) == any(s.tree for s in data.front)


def test_depth_and_mlp_are_shown_where_the_search_has_them(rendered, tmp_path) -> None:
    from .fixtures import make_sized

    def front_headers(page: str) -> list[str]:
        start = page.index('id="front-table"')
        return re.findall(r"<th[^>]*>([^<]*)</th>", page[start:page.index("</thead>", start)])

    _, page, _ = rendered["exhaustive"]  # the paper's one size: neither field is shown
    assert "depth" not in front_headers(page) and "mlp" not in front_headers(page)
    run = make_sized(make_run(tmp_path / "run"))
    data = build_report_data(run)
    page = write_report(run).read_text(encoding="utf-8")
    headers = front_headers(page)
    assert headers[headers.index("inject_layer") + 1:][:2] == ["depth", "mlp"]
    start = page.index('id="front-table"')
    table = page[start:page.index("</table>", start)]
    for s in data.front:
        row = table.split(f'data-spec="{s.spec_id}"', 1)[1].split("</tr>", 1)[0]
        assert f'<td data-v="{s.depth}">{s.depth}</td><td data-v="{s.mlp}">{s.mlp:.2f}</td>' in row
    card = page[page.index('id="best"'):page.index("</pre>", page.index('id="best"'))]
    assert f"depth {data.best.depth} · mlp {data.best.mlp:.2f} · " in card


def test_the_draft_vocab_is_shown_where_the_search_has_it(rendered, tmp_path) -> None:
    from .fixtures import make_vocab

    def front_headers(page: str) -> list[str]:
        start = page.index('id="front-table"')
        return re.findall(r"<th[^>]*>([^<]*)</th>", page[start:page.index("</thead>", start)])

    _, page, _ = rendered["exhaustive"]  # the whole vocabulary: the field is not shown
    assert "draft_vocab" not in front_headers(page)
    card = page[page.index('id="best"'):page.index("</pre>", page.index('id="best"'))]
    assert "vocab " not in card
    run = make_vocab(make_run(tmp_path / "run"))
    data = build_report_data(run)
    page = write_report(run).read_text(encoding="utf-8")
    headers = front_headers(page)
    assert "depth" not in headers  # the one draft size: only the vocabulary varies
    assert headers[headers.index("inject_layer") + 1] == "draft_vocab"
    start = page.index('id="front-table"')
    table = page[start:page.index("</table>", start)]
    for s in data.front:
        row = table.split(f'data-spec="{s.spec_id}"', 1)[1].split("</tr>", 1)[0]
        assert f'<td data-v="{s.draft_vocab}">{s.draft_vocab:.2f}</td>' in row
    card = page[page.index('id="best"'):page.index("</pre>", page.index('id="best"'))]
    assert f"vocab {data.best.draft_vocab:.2f} · " in card and "depth " not in card
