"""Open the report in a real headless Chromium: no console errors, figures drawn, sorting works.

Debian's `chromium` is driven over the DevTools protocol (websocket-client from the dev extra);
`.ci/run` installs it. Screenshots go to the test's temporary folder.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from dreams_nas.reports import build_report_data, write_report
from dreams_nas.reports.figures import FIGURES

from .browser import Browser, find_chromium
from .fixtures import A10G, CPU, H100, make_run

CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (`apt-get install -y chromium`; .ci/run installs it)",
)

WIDTH, HEIGHT = 1440, 900  # a common laptop viewport

FIGURE_BOXES = """JSON.stringify(Array.from(document.querySelectorAll("figure svg.fig")).map(e => {
  const r = e.getBoundingClientRect();
  return {name: e.dataset.figure, w: r.width, h: r.height,
          drawn: e.querySelectorAll("path, use, text").length};
}))"""

COLUMN = """JSON.stringify(Array.from(document.querySelectorAll("#front-table tbody tr"))
  .map(r => r.cells[%d].dataset.v))"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, list[str]]:
    """A run with every optional part (Optuna history, 3 machines): the page has every figure."""
    run = make_run(tmp_path_factory.mktemp("browser") / "run", optuna=True,
                   hardware=(CPU, H100, A10G))
    return write_report(run), [name for name, *_ in FIGURES]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with Browser(CHROMIUM, tmp_path_factory.mktemp("chromium-profile"), WIDTH, HEIGHT) as b:
        yield b


def test_report_in_headless_chromium(browser, report, tmp_path) -> None:
    page, names = report
    browser.open(page)
    assert browser.errors == []
    # Self-contained: the page loaded nothing besides itself.
    assert browser.evaluate("performance.getEntriesByType('resource').length") == 0

    # Every figure rendered with a real size and drawn content.
    boxes = json.loads(browser.evaluate(FIGURE_BOXES))
    assert [b["name"] for b in boxes] == names
    for box in boxes:
        assert box["w"] > 300 and box["h"] > 150, box
        assert box["drawn"] > 10, box

    # First glance: the best-subnet card and the Pareto figure are inside the first screen.
    for selector in ("#best", "#fig-pareto_latency"):
        rect = json.loads(browser.evaluate(
            f"JSON.stringify(document.querySelector('{selector}').getBoundingClientRect())"))
        assert rect["top"] >= 0 and rect["bottom"] <= HEIGHT and rect["right"] <= WIDTH, (
            selector, rect)
    browser.screenshot(tmp_path / "report-first-screen.png")

    # Sorting: a real click on the "draft ms" header sorts ascending, a second click descending.
    headers = browser.evaluate(
        "Array.from(document.querySelectorAll('#front-table th')).map(th => th.textContent)")
    col = headers.index("draft ms")
    before = json.loads(browser.evaluate(COLUMN % col))
    assert len(before) > 2
    assert [float(v) for v in before] != sorted(float(v) for v in before), "fixture already sorted"
    browser.click(f"#front-table th:nth-child({col + 1})")
    ascending = [float(v) for v in json.loads(browser.evaluate(COLUMN % col))]
    assert ascending == sorted(float(v) for v in before)
    browser.click(f"#front-table th:nth-child({col + 1})")
    descending = [float(v) for v in json.loads(browser.evaluate(COLUMN % col))]
    assert descending == sorted(ascending, reverse=True)
    # Text column, and the rows move whole (spec id stays with its own draft ms).
    sid = headers.index("spec id")
    browser.click(f"#front-table th:nth-child({sid + 1})")
    ids = json.loads(browser.evaluate(COLUMN % sid))
    assert ids == sorted(ids)
    pairs = json.loads(browser.evaluate(
        "JSON.stringify(Array.from(document.querySelectorAll('#front-table tbody tr'))"
        f".map(r => [r.cells[{sid}].dataset.v, +r.cells[{col}].dataset.v]))"))
    data = build_report_data(page.parent)
    assert {s: ms for s, ms in pairs} == {s.spec_id: s.draft_ms for s in data.front}
    assert browser.errors == []
    browser.screenshot(tmp_path / "report-full.png", full_page=True)
    assert (tmp_path / "report-first-screen.png").stat().st_size > 20_000


def test_the_harness_sees_console_errors(browser, tmp_path) -> None:
    # The check above can fail: a page with a console error and an exception is caught.
    bad = tmp_path / "bad.html"
    bad.write_text("<!DOCTYPE html><html><head><link rel='icon' href='data:,'></head><body>"
                   "<script>console.error('broken figure'); undefinedFunction();</script>"
                   "</body></html>")
    browser.open(bad)
    assert any("broken figure" in e for e in browser.errors)
    assert any("undefinedFunction" in e for e in browser.errors)
