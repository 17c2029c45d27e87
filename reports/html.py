"""Render a `ReportData` and its figures as one self-contained HTML page.

No external scripts, styles or fonts: the figures are inline SVG, the style sheet and the
few lines of table-sorting JavaScript are inline, so the page opens offline and can be mailed.
"""

from __future__ import annotations

import html
import shlex
from collections.abc import Sequence
from datetime import UTC, datetime

import numpy as np
from dreams_nas.reports.figures import RenderedFigure
from dreams_nas.reports.values import ReportData
from dreams_nas.supernet.core.runfolder import RunFolder

# In this file's templates a backslash at a line's end joins the next line to it (no line break
# in the page): long rules and tags stay within 100 columns without changing the output.
CSS = """
:root { --ink:#1d2330; --muted:#5f6878; --line:#e2e5ea; --bg:#f6f7f9; --accent:#d62728;
        --card:#ffffff; --front:#eef3fb; }
* { box-sizing: border-box; }
body { margin:0; background:var(--bg); color:var(--ink);
       font:14px/1.45 system-ui, -apple-system, "Segoe UI", "DejaVu Sans", Roboto, sans-serif; }
main { max-width:1440px; margin:0 auto; padding:14px 22px 40px; }
header { background:#1d2330; color:#fff; padding:12px 22px 10px; }
header .inner { max-width:1440px; margin:0 auto; }
header h1 { font-size:19px; margin:0 0 4px; font-weight:600; letter-spacing:.1px; }
header h1 .hw { color:#9fc3ff; }
header .meta { color:#c9cfda; font-size:12.5px; display:flex; flex-wrap:wrap; gap:2px 18px; }
header .meta b { color:#fff; font-weight:600; }
section { margin:16px 0; }
h2 { font-size:16px; margin:0 0 8px; }
.top { display:grid; grid-template-columns:minmax(290px, 350px) 1fr; gap:16px; \
align-items:start; }
.panel { background:var(--card); border:1px solid var(--line); border-radius:8px; \
padding:12px 14px; }
.card h2 { font-size:12px; text-transform:uppercase; letter-spacing:.8px; color:var(--muted); \
margin:0; }
.card .spec { font:600 21px/1.3 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; \
margin:2px 0 4px; }
.card .fields { color:var(--muted); font-size:12.5px; margin-bottom:10px; }
.big { display:grid; grid-template-columns:1fr 1fr; gap:8px; margin-bottom:10px; }
.big div { background:var(--bg); border-radius:6px; padding:6px 10px; }
.big .v { font-size:26px; font-weight:700; line-height:1.15; }
.big .pred .v { color:var(--accent); }
.big .l { font-size:11.5px; color:var(--muted); }
.kv { width:100%; border-collapse:collapse; font-size:13px; }
.kv td { padding:3px 0; border-bottom:1px solid var(--line); }
.kv td:last-child { text-align:right; font-variant-numeric:tabular-nums; }
.note { font-size:12px; color:var(--muted); margin:8px 0 0; }
.warn { color:#9a5b00; }
code, pre { font:12px/1.4 ui-monospace, "DejaVu Sans Mono", Menlo, monospace; }
pre.cmd { background:#1d2330; color:#e8ecf3; padding:7px 9px; border-radius:6px; margin:6px 0 0;
          white-space:pre-wrap; word-break:break-all; }
figure { margin:0; }
figure svg.fig { width:100%; height:auto; display:block; }
figcaption { font-size:12px; color:var(--muted); margin-top:4px; }
.grid { display:grid; grid-template-columns:repeat(auto-fit, minmax(520px, 1fr)); gap:16px; }
table.front { width:100%; border-collapse:collapse; font-size:13px; background:var(--card); }
table.front th, table.front td { padding:5px 8px; border-bottom:1px solid var(--line); \
text-align:right;
          white-space:nowrap; font-variant-numeric:tabular-nums; }
table.front th { position:sticky; top:0; background:#eceff3; cursor:pointer; user-select:none; }
table.front th:hover { background:#e1e6ee; }
table.front th[aria-sort=ascending]::after { content:" \\25B2"; font-size:10px; }
table.front th[aria-sort=descending]::after { content:" \\25BC"; font-size:10px; }
table.front td.id, table.front th.id { text-align:left; \
font-family:ui-monospace, "DejaVu Sans Mono", monospace; }
table.front td.cmd { text-align:left; }
table.front td.cmd code { font-size:11.5px; color:#333; }
table.front tr.best td { background:#fdecec; font-weight:600; }
.scroll { overflow:auto; max-height:520px; border:1px solid var(--line); border-radius:8px; }
.tag { display:inline-block; font-size:11px; padding:0 5px; border-radius:4px; background:#e7ebf2;
       color:#333; font-weight:500; }
.tag.best { background:var(--accent); color:#fff; }
footer { color:var(--muted); font-size:12px; margin-top:24px; }
@media (max-width: 980px) { .top { grid-template-columns:1fr; } \
.grid { grid-template-columns:1fr; } }
"""

# Click a header to sort by it (again to reverse); numbers sort numerically, blanks last.
SORT_JS = """
document.querySelectorAll("table.sortable th").forEach(function (th) {
  th.addEventListener("click", function () {
    var body = th.closest("table").tBodies[0], i = th.cellIndex, num = th.dataset.type === "num";
    var asc = th.getAttribute("aria-sort") !== "ascending";
    th.parentNode.querySelectorAll("th").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", asc ? "ascending" : "descending");
    var key = function (r) { var v = r.cells[i].dataset.v; \
return num ? (v === "" ? NaN : +v) : v; };
    Array.from(body.rows).sort(function (a, b) {
      var x = key(a), y = key(b);
      if (num && isNaN(x) !== isNaN(y)) { return isNaN(x) ? 1 : -1; }
      var c = num ? (x - y) : String(x).localeCompare(String(y));
      return asc ? c : -c;
    }).forEach(function (r) { body.appendChild(r); });
  });
});
"""


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def _f(value: float | None, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def generate_command(data: ReportData, spec_id: str) -> str:
    """The command that generates with an exported subnet of this run."""
    target = str(data.target.get("id") or "builtin")
    spec_dir = RunFolder(data.run_dir).spec_dir(spec_id)
    # --target builtin is generate's default: leave it out to keep the line short.
    target_opt = "" if target == "builtin" else f" --target {shlex.quote(target)}"
    return (f"dreams-nas generate{target_opt} --drafter {shlex.quote(str(spec_dir))} "
            f"--image IMAGE.png --prompt \"...\"")


def _when(stamp: str | None) -> str:
    """An ISO-8601 time as '2026-11-30 15:00 UTC' (as written when it is not ISO-8601)."""
    if not stamp:
        return "?"
    try:
        moment = datetime.fromisoformat(stamp)
    except ValueError:
        return stamp
    if moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
        return moment.strftime("%Y-%m-%d %H:%M UTC")
    return moment.strftime("%Y-%m-%d %H:%M")


def _header(data: ReportData) -> str:
    t, hw = data.target, data.hardware
    target = _e(t.get("id") or "unknown target")
    target_bits = ", ".join(_e(x) for x in (
        t.get("family"), f"{t['num_layers']} layers" if t.get("num_layers") else None,
        f"hidden {t['hidden_size']}" if t.get("hidden_size") else None) if x)
    hw_bits = ", ".join(_e(x) for x in (
        hw.get("kind"),
        f"{hw['memory_gb']:g} GB" if isinstance(hw.get("memory_gb"), int | float) else None,
        f"CUDA {hw['cuda']}" if hw.get("cuda") else None,
        f"driver {hw['driver']}" if hw.get("driver") else None,
        f"{hw['threads']} threads" if hw.get("threads") else None, hw.get("dtype")) if x)
    supernet = _e(data.supernet_hash or "unknown")
    if data.supernet_params:
        supernet += f" ({data.supernet_params / 1e6:.2f} M params)"
    curve = data.training
    if curve is not None and curve.best_step is not None and curve.best_score is not None:
        supernet += (f", kept step {curve.best_step}: held-out τ {curve.best_score:.2f} "
                     f"(γ {curve.draft_len}, mean of the largest and smallest subnet)")
    versions = ", ".join(f"{_e(k)} {_e(v)}" for k, v in data.versions.items()
                         if k in {"dreams-nas", "torch", "transformers", "optuna", "scikit-learn",
                                  "python"})
    searched = len(data.subnets)
    return f"""<header><div class="inner">
<h1>dreams-nas report · {target} on \
<span class="hw">{_e(hw.get("name") or data.hardware_id)}</span></h1>
<div class="meta">
<span>target <b>{target}</b>{f" ({target_bits})" if target_bits else ""}</span>
<span>supernet <b>{supernet}</b></span>
<span>hardware <b>{_e(data.hardware_id)}</b>{f" ({hw_bits})" if hw_bits else ""}</span>
{_transfer_span(data)}\
<span>search <b>{_e(data.best.method)}</b>, objective {_e(data.best.objective)}, \
{_n(searched, "subnet")}, front {len(data.front)}</span>
<span>searched {_e(_when(data.best.created))} · report {_e(data.generated)}</span>
<span>{versions}</span>
</div></div></header>"""


def _transfer_span(data: ReportData) -> str:
    """The header's line for a transferred latency predictor (empty for a profiled one)."""
    pred = data.predictor
    if pred is None or not pred.transfer:
        return ""
    return f"<span>latency <b>{_e(pred.transfer)}</b></span>\n"


def _best_card(data: ReportData) -> str:
    b = data.best
    measured = _f(b.measured_speedup, ".2f", "×")
    gap = b.speedup_gap
    gap_text = ""
    if gap is not None:
        cls = ' class="warn"' if abs(gap) > 0.15 else ""
        gap_text = f'<p class="note"{cls}>measured is {100 * gap:+.1f}% from the prediction' + (
            " (over 15%: check the latency profile and τ)" if abs(gap) > 0.15 else "") + "</p>"
    tau = _f(b.predicted_tau)
    if b.tau_ci:
        tau += f" <span class=\"note\">[{b.tau_ci[0]:.2f}, {b.tau_ci[1]:.2f}]</span>"
    rows = [("τ (acceptance length), 95% CI", tau),
            ("draft step", _f(b.draft_ms, ".2f", " ms")),
            ("verify (γ+1 positions)", _f(b.verify_ms, ".2f", " ms")),
            ("target decode step", _f(b.decode_ms, ".2f", " ms"))]
    if b.measured_tau is not None:
        rows.append(("measured τ", _f(b.measured_tau)))
    if b.measured_range and b.measured_repeats and b.measured_repeats > 1:
        rows.append((f"measured speedup, decode phase: median of {b.measured_repeats} passes, "
                     "range", f"{b.measured_range[0]:.2f}–{b.measured_range[1]:.2f}×"))
    if b.measured_speedup_end_to_end is not None:
        rows.append(("measured speedup, whole calls (prefill included)",
                     _f(b.measured_speedup_end_to_end, ".2f", "×")))
    if b.tokens_per_s is not None:
        rows.append(("tokens/s (target alone)",
                     f"{b.tokens_per_s:.1f} ({_f(b.baseline_tokens_per_s, '.1f')})"))
    kv = "".join(f"<tr><td>{_e(k)}</td><td>{v}</td></tr>" for k, v in rows)
    exported = "" if b.exported else (
        f'<p class="note warn">spec folder {_e(b.spec_dir)} is not in the run folder</p>')
    return f"""<div class="panel card" id="best">
<h2>Best subnet · {_e(data.hardware_id)}</h2>
<div class="spec">{_e(b.spec_id)}</div>
<div class="fields">heads {b.heads} · visual_keep {b.visual_keep:.2f} · \
inject_layer {b.inject_layer} · {_size_fields(data)}\
{f"token tree {_e(b.tree)} ({b.draft_len} levels)" if b.tree else f"draft_len γ={b.draft_len}"}\
</div>
<div class="big">
<div class="pred"><div class="v" id="best-predicted">{b.predicted_speedup:.2f}×</div>\
<div class="l">predicted speedup</div></div>
<div class="meas"><div class="v" id="best-measured">{measured}</div>\
<div class="l">measured (decode phase)</div></div>
</div>
<table class="kv">{kv}</table>{gap_text}
<pre class="cmd">{_e(generate_command(data, b.spec_id))}</pre>{exported}
</div>"""


def _size_fields(data: ReportData) -> str:
    """``depth 2 · mlp 0.50 · `` for a search over draft sizes, ``vocab 0.25 · `` for one over
    draft vocabularies (both, or "" for the paper's one size over the whole vocabulary)."""
    b = data.best
    out = ""
    if data.columns.is_elastic_size or b.depth != 1 or b.mlp != 1.0:
        out += f"depth {b.depth} · mlp {b.mlp:.2f} · "
    if data.columns.is_draft_vocab or b.draft_vocab != 1.0:
        out += f"vocab {b.draft_vocab:.2f} · "
    return out


def _figure(fig: RenderedFigure) -> str:
    return (f'<figure class="panel" id="fig-{_e(fig.name)}">{fig.svg}'
            f"<figcaption>{_e(fig.caption)}</figcaption></figure>")


def _front_table(data: ReportData) -> str:
    measured = {v.spec_id: v.measured_speedup for v in data.verified}
    sizes = data.columns.is_elastic_size  # depth and mlp columns only when they vary
    vocab = data.columns.is_draft_vocab  # the draft_vocab column only when it varies
    cols = [("spec id", "str", "id"), ("heads", "num", ""), ("visual_keep", "num", ""),
            ("inject_layer", "num", ""),
            *([("depth", "num", ""), ("mlp", "num", "")] if sizes else []),
            *([("draft_vocab", "num", "")] if vocab else []),
            ("shape", "num", ""), ("speedup ×", "num", ""),
            ("measured ×", "num", ""), ("τ", "num", ""), ("τ 95% CI", "num", ""),
            ("draft ms", "num", ""), ("verify ms", "num", ""), ("params M", "num", ""),
            ("generate with it", "str", "cmd")]
    # Rows arrive best speedup first: the header says so.
    head = "".join(f'<th data-type="{t}" class="{c}" title="sort by {_e(n)}"'
                   f'{" aria-sort=descending" if n == "speedup ×" else ""}>{_e(n)}</th>'
                   for n, t, c in cols)

    def cell(value: object, text: str, cls: str = "") -> str:
        v = "" if value is None else value
        return f'<td data-v="{_e(v)}"{f" class={cls!r}" if cls else ""}>{text}</td>'

    rows = []
    for s in data.front:
        is_best = s.spec_id == data.best.spec_id
        tag = ' <span class="tag best">best</span>' if is_best else ""
        m = measured.get(s.spec_id)
        ci = (f"{s.tau_lo:.2f}–{s.tau_hi:.2f}"
              if s.tau_lo is not None and s.tau_hi is not None else "–")
        cmd = _e(generate_command(data, s.spec_id))
        if s.spec_id not in data.exported_specs:
            cmd += (' <span class="tag" title="no specs/&lt;id&gt;/spec.json in the run">'
                    'not exported</span>')
        rows.append(
            f'<tr{" class=best" if is_best else ""} data-spec="{_e(s.spec_id)}">'
            + cell(s.spec_id, _e(s.spec_id) + tag, "id") + cell(s.heads, str(s.heads))
            + cell(s.visual_keep, f"{s.visual_keep:.2f}")
            + cell(s.inject_layer, str(s.inject_layer))
            + (cell(s.depth, str(s.depth)) + cell(s.mlp, f"{s.mlp:.2f}") if sizes else "")
            + (cell(s.draft_vocab, f"{s.draft_vocab:.2f}") if vocab else "")
            + cell(s.draft_len, _e(s.shape)) + cell(s.speedup, f"{s.speedup:.3f}")
            + cell(m, _f(m, ".3f")) + cell(s.tau, f"{s.tau:.2f}") + cell(s.tau_lo, ci)
            + cell(s.draft_ms, f"{s.draft_ms:.2f}") + cell(s.verify_ms, _f(s.verify_ms))
            + cell(s.draft_params / 1e6 if s.draft_params else None,
                   _f(s.draft_params / 1e6 if s.draft_params else None, ".2f"))
            + cell(s.spec_id, f"<code>{cmd}</code>", "cmd") + "</tr>")
    return f"""<section id="front">\
<h2>Pareto front ({len(data.front)} of {_n(len(data.subnets), "subnet")})</h2>
<div class="scroll"><table class="front sortable" id="front-table"><thead><tr>{head}</tr></thead>
<tbody>{"".join(rows)}</tbody></table></div>
{_shapes_note(data)}<p class="note">Click a column to sort. Speedup is predicted: \
τ · T_decode / ((γ − 1) · T_draft + T_draft_first + T_verify) for a chain (a token tree: one \
draft step per level at that level's width, and the verify of all its nodes);
measured where the subnet was verified end to end. \
All trials: search/{_e(data.hardware_id)}/trials.csv.</p>
</section>"""


def _shapes_note(data: ReportData) -> str:
    """Chain vs token tree: the best of each this search scored, and which the front holds."""
    table = data.columns
    trees = table.is_tree
    if not trees.any() or trees.all():
        return ""
    parts = []
    for name, mask in (("chain", ~trees), ("tree", trees)):
        i = int(np.flatnonzero(mask)[np.argmax(table.speedup[mask])])
        parts.append(f"best {name}: <code>{_e(table.spec_id[i])}</code> "
                     f"{table.speedup[i]:.3f}× (τ {table.tau[i]:.2f})")
    on_front = sum(1 for s in data.front if s.tree)
    return (f'<p class="note" id="shapes">{" · ".join(parts)} · the front holds '
            f"{on_front} tree(s) and {len(data.front) - on_front} chain(s).</p>\n")


def _cross_table(data: ReportData) -> str:
    cross = data.cross_hardware
    if cross is None:
        return ""
    head = "".join(f'<th data-type="num">on {_e(hw)}</th>' for hw in cross.hardware_ids)

    def share(i: int, j: int, v: float | None) -> str:
        # Off the diagonal, in brackets: the share of hardware j's own best.
        if v is None or i == j:
            return ""
        return f" <span class=note>({100 * cross.relative(i, j):.1f}%)</span>"

    rows = []
    for i, (hw, sid) in enumerate(zip(cross.hardware_ids, cross.best_spec_ids, strict=True)):
        cells = "".join(
            f'<td data-v="{"" if v is None else v}">'
            f'{"<b>" if i == j else ""}{"–" if v is None else f"{v:.2f}×"}'
            f'{"</b>" if i == j else ""}{share(i, j, v)}</td>'
            for j, v in enumerate(cross.speedup[i]))
        rows.append(f'<tr><td class="id" data-v="{_e(hw)}">{_e(hw)}</td>'
                    f'<td class="id" data-v="{_e(sid)}">{_e(sid)}</td>{cells}</tr>')
    return f"""<section id="cross"><h2>Best subnet per hardware</h2>
<div class="scroll"><table class="front sortable" id="cross-table"><thead><tr>
<th data-type="str" class="id">hardware</th>\
<th data-type="str" class="id">its best subnet</th>{head}
</tr></thead><tbody>{"".join(rows)}</tbody></table></div>
<p class="note">Expected speedup of each hardware's best subnet on every searched hardware,
looked up in that hardware's trials.csv (– where it was not evaluated there); in brackets, the
share of that hardware's own best. An id ending in -b&lt;B&gt; is the same device searched for B
requests decoded together (<code>search --batch-size</code>): its row is the pick for that
batch size, and its share elsewhere what that pick loses at the other batch sizes.</p></section>"""


def render_html(data: ReportData, figures: Sequence[RenderedFigure],
                figure_folder: str | None = None) -> str:
    """The whole page as a string."""
    by_name = {f.name: f for f in figures}
    main_fig = by_name.get("pareto_latency")
    rest = [f for f in figures if f.name != "pareto_latency"]
    top = _best_card(data) + (_figure(main_fig) if main_fig else "")
    files = (f'<p>Figures as PNG and SVG: <code>{_e(figure_folder)}/</code></p>'
             if figure_folder else "")
    title = f"dreams-nas report · {data.target.get('id') or 'run'} · {data.hardware_id}"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{_e(title)}</title>
<style>{CSS}</style></head>
<body>
{_header(data)}
<main>
<section class="top">{top}</section>
{_front_table(data)}
<section id="figures"><div class="grid">{"".join(_figure(f) for f in rest)}</div></section>
{_cross_table(data)}
<footer>Run folder <code>{_e(data.run_dir)}</code>. {files}
Generated by dreams-nas {_e(data.versions.get("dreams-nas", ""))} on {_e(data.generated)}.</footer>
</main>
<script>{SORT_JS}</script>
</body></html>
"""

