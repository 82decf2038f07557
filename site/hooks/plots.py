"""Line plots made at build time from site/data/plots/*.json (a probe's rows, committed with the GPU they ran on).

A lesson page writes `<!-- plot: 08-flash-attention-seqlen -->` on a line of its own; the hook replaces it with an
SVG (generated here from the data, not drawn by hand) and a caption naming the GPU and the command. The JSON is what
a probe wrote (a list of "rows", each a dict), plus a "plot" entry saying how to draw it:

    "plot": {"x": "seqlen", "y": "tflops", "series": "rung", "panels": ["head_dim", "causal"],
             "x_label": "sequence length", "y_label": "TFLOP/s", "log2_x": true, "title": "..."}

one panel per distinct value of the "panels" keys, one line per "series" value. "x_format": "bytes" labels a log2 x
axis of sizes at powers of 2 (1 MiB, 16 MiB, ...) instead of at every x (a shape sweep has dozens). A marker without
data fails the strict build (a warning), as bench.py's does.
"""
from __future__ import annotations

import cmath  # not math: site/hooks/math.py (the MathML hook) shadows it when this folder is on sys.path
import html
import json
import logging
import re

from mkdocs.structure.files import File

from coursekit import trees

log = logging.getLogger("mkdocs.hooks.plots")
DATA = trees.PLOT_DATA
MARKER = re.compile(r"^<!--\s*plot:\s*([0-9]{2}-[a-z0-9-]+)\s*-->$", re.MULTILINE)


def _log2(x: float) -> float:
    return cmath.log(x, 2).real


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


PANEL_W, PANEL_H, MARGIN_L, MARGIN_B, GAP = 340, 230, 52, 36, 28
# Colour-blind-safe (Okabe-Ito), one per series in the order the series first appear in the rows.
COLOURS = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442"]


def _bytes_label(n: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def _x_ticks(spec: dict, xs: list) -> list[tuple[float, str]]:
    """A tick at every x, labelled with %g; with "x_format": "bytes" (a sweep's sizes, many and uneven), ticks at
    powers of 2 inside the data's range instead, at most MAX_BYTE_TICKS of them, labelled in KiB / MiB / GiB."""
    if spec.get("x_format") != "bytes":
        return [(x, f"{x:g}") for x in xs]
    low, high = int(-(-_log2(xs[0]) // 1)), int(_log2(xs[-1]) // 1)
    step = max(1, _ceil_div(high - low + 1, MAX_BYTE_TICKS))
    return [(2**k, _bytes_label(2**k)) for k in range(low, high + 1, step)]


MAX_BYTE_TICKS = 6


def load(name: str) -> dict | None:
    path = DATA / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def _panel_title(spec: dict, key: tuple) -> str:
    parts = []
    for name, value in zip(spec["panels"], key):
        parts.append(("causal" if value else "non-causal") if isinstance(value, bool) else f"{name} {value}")
    return ", ".join(parts)


def svg_plot(data: dict) -> str:
    spec, rows = data["plot"], data["rows"]
    series = list(dict.fromkeys(r[spec["series"]] for r in rows))
    panels = list(dict.fromkeys(tuple(r[k] for k in spec["panels"]) for r in rows))
    xs = sorted({r[spec["x"]] for r in rows})
    ymax = max(r[spec["y"]] for r in rows) * 1.08
    columns = 2 if len(panels) > 1 else 1
    grid_rows = _ceil_div(len(panels), columns)
    cell_w, cell_h = MARGIN_L + PANEL_W + GAP, PANEL_H + MARGIN_B + GAP
    legend_h = 22 * _ceil_div(len(series), 2) + 10
    width, height = columns * cell_w + 10, 30 + grid_rows * cell_h + legend_h

    def fx(x: float) -> float:
        lo, hi = (_log2(xs[0]), _log2(xs[-1])) if spec.get("log2_x") else (xs[0], xs[-1])
        value = _log2(x) if spec.get("log2_x") else x
        return PANEL_W * (value - lo) / ((hi - lo) or 1)

    def fy(y: float) -> float:
        return PANEL_H * (1 - y / ymax)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11" role="img">',
             f"<title>{html.escape(spec.get('title', ''))} on {html.escape(data['device'])}</title>",
             "<style>.label{fill:#333}.axis{stroke:#555}.grid{stroke:#ddd}</style>",
             f'<text class="label" x="10" y="18" font-size="13">{html.escape(spec.get("title", ""))}, '
             f'{html.escape(data["device"])}</text>']
    step = 10 ** int(cmath.log10(ymax / 4).real // 1)
    tick = step * min((m for m in (1, 2, 5, 10) if ymax / (step * m) <= 6), default=10)
    for index, key in enumerate(panels):
        ox = 10 + (index % columns) * cell_w + MARGIN_L
        oy = 30 + (index // columns) * cell_h + 16
        parts.append(f'<g transform="translate({ox},{oy})">')
        parts.append(f'<text class="label" x="{PANEL_W / 2}" y="-4" text-anchor="middle">'
                     f'{html.escape(_panel_title(spec, key))}</text>')
        y = 0.0
        while y <= ymax:
            parts.append(f'<line class="grid" x1="0" x2="{PANEL_W}" y1="{fy(y):.1f}" y2="{fy(y):.1f}"/>'
                         f'<text class="label" x="-6" y="{fy(y) + 4:.1f}" text-anchor="end">{y:g}</text>')
            y += tick
        for x, label in _x_ticks(spec, xs):
            parts.append(f'<text class="label" x="{fx(x):.1f}" y="{PANEL_H + 14}" text-anchor="middle">{label}</text>')
        parts.append(f'<line class="axis" x1="0" y1="{PANEL_H}" x2="{PANEL_W}" y2="{PANEL_H}"/>'
                     f'<line class="axis" x1="0" y1="0" x2="0" y2="{PANEL_H}"/>')
        parts.append(f'<text class="label" x="{PANEL_W / 2}" y="{PANEL_H + 30}" text-anchor="middle">'
                     f'{html.escape(spec["x_label"])}</text>')
        parts.append(f'<text class="label" transform="rotate(-90)" x="{-PANEL_H / 2}" y="-38" '
                     f'text-anchor="middle">{html.escape(spec["y_label"])}</text>')
        for colour, name in zip(COLOURS * 2, series):
            points = sorted((r[spec["x"]], r[spec["y"]]) for r in rows
                            if r[spec["series"]] == name and tuple(r[k] for k in spec["panels"]) == key)
            if not points:
                continue
            path = " ".join(f"{fx(x):.1f},{fy(y):.1f}" for x, y in points)
            parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
            parts += [f'<circle cx="{fx(x):.1f}" cy="{fy(y):.1f}" r="2.5" fill="{colour}"/>' for x, y in points]
        parts.append("</g>")
    top = 30 + grid_rows * cell_h
    for index, (colour, name) in enumerate(zip(COLOURS * 2, series)):
        x, y = 10 + MARGIN_L + (index % 2) * (width // 2), top + 22 * (index // 2)
        parts.append(f'<line x1="{x}" x2="{x + 22}" y1="{y}" y2="{y}" stroke="{colour}" stroke-width="3"/>'
                     f'<text class="label" x="{x + 28}" y="{y + 4}">{html.escape(str(name))}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def on_files(files, config):
    for path in sorted(DATA.glob("*.json")):
        files.append(File.generated(config, f"plots/{path.stem}.svg", content=svg_plot(json.loads(path.read_text()))))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        name = match.group(1)
        data = load(name)
        if data is None:
            log.warning(f"{page.file.src_uri}: no plot data site/data/plots/{name}.json for <!-- plot: {name} -->")
            return f"*No data for the plot {name} yet.*"
        image = "../" * page.file.src_uri.count("/") + f"plots/{name}.svg"
        spec = data["plot"]
        return (f'<figure class="bench" markdown>\n![{html.escape(spec.get("title", name))} on {data["device"]}]'
                f"({image})\n</figure>\n\n*{spec.get('caption', '')} Measured on {data['device']} with torch "
                f"{data.get('torch')} by `{data['command']}`; the rows are in site/data/plots/{name}.json.*\n")

    return MARKER.sub(replace, markdown)
