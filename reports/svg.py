"""A matplotlib figure as SVG: a standalone document for the static copy, and an inline
<svg> element for the page."""

from __future__ import annotations

import html
import io
import re

import matplotlib
from dreams_nas.reports.plotting import STYLE
from matplotlib.figure import Figure

_SVG_START = re.compile(r"<svg\b[^>]*>", re.S)
_ID = re.compile(r'\sid="([^"]+)"')
_ID_USE = re.compile(r'(\sid="|href="#|url\(#)([^"\)]+)(["\)])')


def figure_to_svg(fig: Figure, salt: str, label: str = "") -> tuple[str, str]:
    """The figure as (inline <svg> element that scales with its container, standalone document).

    Inline, every element id is prefixed with `salt` so ids stay unique across the figures of
    one page; `svg.hashsalt` and no date in the metadata make the output deterministic.
    """
    buf = io.StringIO()
    with matplotlib.rc_context({**STYLE, "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    document = buf.getvalue()
    svg = document[document.index("<svg"):]
    ids = set(_ID.findall(svg))
    svg = _ID_USE.sub(lambda m: f"{m.group(1)}{salt}-{m.group(2)}{m.group(3)}"
                      if m.group(2) in ids else m.group(0), svg)
    head = _SVG_START.match(svg).group(0)
    bare_head = re.sub(r'\s(width|height)="[^"]*"', "", head)
    attributes = f'class="fig" role="img" data-figure="{salt}" aria-label="{html.escape(label)}"'
    bare_head = bare_head.replace("<svg", f"<svg {attributes}", 1)
    return bare_head + svg[len(head):], document
