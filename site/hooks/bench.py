"""Benchmark tables and figures, made at build time from site/data/bench/*.json.

A lesson page writes `<!-- bench: 00-first-kernel -->` where its results go. The
hook replaces it with a figure (an SVG generated here, not drawn by hand) and a
table of every case: our time, the PyTorch baseline, the ratio and the target.
The JSON files are what `./course bench N --json` wrote on a GPU, committed.

A lesson written before its kernels ran on a GPU writes `<!-- bench: NN-slug pending -->`
instead: it renders a "no GPU results yet" box (class bench-pending, which the browser check
accepts in place of the figure) and the build fails once the results exist but the page still
says pending. A plain marker without results fails the strict build too.
"""
from __future__ import annotations

import html
import json
import logging
import os
import re
from pathlib import Path

from mkdocs.structure.files import File

from coursekit import trees

log = logging.getLogger("mkdocs.hooks.bench")
# COURSE_BENCH_DATA points the build at another folder of results (a test build, a GPU box's
# fresh run); the committed ones are the default.
DATA = Path(os.environ.get("COURSE_BENCH_DATA") or trees.BENCH_DATA)
MARKER = re.compile(r"<!--\s*bench:\s*([0-9]{2}-[a-z0-9-]+)(\s+pending)?\s*-->")
BAR_HEIGHT, GAP, LABEL_WIDTH, PLOT_WIDTH = 22, 10, 230, 420


def load(name: str) -> dict | None:
    path = DATA / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def svg_chart(data: dict) -> str:
    """Horizontal bars: ratio = PyTorch time / our time; a tick marks each case's target."""
    cases = data["cases"]
    top = max([1.2] + [c["ratio"] * 1.1 for c in cases] + [c["target"] * 1.1 for c in cases])
    scale = PLOT_WIDTH / top
    height = 40 + len(cases) * (BAR_HEIGHT + GAP) + 30
    width = LABEL_WIDTH + PLOT_WIDTH + 70
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="12" role="img">',
        f"<title>{html.escape(data['lab'])}: speed relative to PyTorch on {html.escape(data['gpu'])}</title>",
        # Drawn for a light page. On the site's dark scheme, site/css/course.css inverts the image
        # (a media query in here would follow the OS setting, not the page's palette toggle).
        '<style>.label{fill:#333}.bar{fill:#3f6ec6}.miss{fill:#c8553d}.target{stroke:#111;stroke-width:2}'
        '.one{stroke:#888;stroke-dasharray:4 3}</style>',
        f'<text class="label" x="{LABEL_WIDTH}" y="18">ratio = PyTorch time / our time on {html.escape(data["gpu"])} '
        f'(higher is faster; tick = target)</text>',
    ]
    x_one = LABEL_WIDTH + scale
    parts.append(f'<line class="one" x1="{x_one:.1f}" y1="26" x2="{x_one:.1f}" y2="{height - 24}"/>')
    parts.append(f'<text class="label" x="{x_one:.1f}" y="{height - 8}" text-anchor="middle">1.0x</text>')
    for i, case in enumerate(cases):
        y = 32 + i * (BAR_HEIGHT + GAP)
        w = max(1.0, case["ratio"] * scale)
        kind = "bar" if case["ratio"] >= case["target"] else "miss"
        parts.append(f'<text class="label" x="{LABEL_WIDTH - 8}" y="{y + 15}" text-anchor="end">'
                     f'{html.escape(case["name"])}</text>')
        parts.append(f'<rect class="{kind}" x="{LABEL_WIDTH}" y="{y}" width="{w:.1f}" height="{BAR_HEIGHT}"/>')
        parts.append(f'<text class="label" x="{LABEL_WIDTH + w + 6:.1f}" y="{y + 15}">{case["ratio"]:.2f}x</text>')
        xt = LABEL_WIDTH + case["target"] * scale
        parts.append(f'<line class="target" x1="{xt:.1f}" y1="{y - 3}" x2="{xt:.1f}" y2="{y + BAR_HEIGHT + 3}"/>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def markdown_table(data: dict) -> str:
    rows = [
        "| case | ours (ms) | baseline | baseline (ms) | ratio | target | bandwidth | % of copy |",
        "|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for c in data["cases"]:
        bandwidth = (f"{c['ours_gbps']:.0f} GB/s" if c.get("ours_gbps")
                     else f"{c['ours_tflops']:.1f} TFLOP/s" if c.get("ours_tflops") else "")
        pct = f"{c['pct_of_copy']:.0f}%" if c.get("pct_of_copy") else ""
        met = "" if c["ratio"] >= c["target"] else " (below)"
        rows.append(f"| {c['name']} | {c['ours_ms']:.3f} | `{c['baseline_name']}` | {c['baseline_ms']:.3f} | "
                    f"**{c['ratio']:.2f}x**{met} | {c['target']:.2f}x | {bandwidth} | {pct} |")
    copy = f", copy ceiling {data['copy_bandwidth_gbps']:.0f} GB/s" if data.get("copy_bandwidth_gbps") else ""
    caption = (f"*Measured on {data['gpu']} with torch {data.get('torch')}{copy}, {data['date']}, "
               f"by `{data['command']}`; ratio = baseline time / our time.*")
    return "\n".join(rows) + "\n\n" + caption


def on_files(files, config):
    for path in sorted(DATA.glob("*.json")):
        data = json.loads(path.read_text())
        files.append(File.generated(config, f"bench/{path.stem}.svg", content=svg_chart(data)))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    def replace(match: re.Match) -> str:
        name, pending = match.group(1), bool(match.group(2))
        data = load(name)
        if pending and data is None:
            return (f'<div class="admonition warning bench-pending" markdown>\n'
                    f'<p class="admonition-title">No GPU results yet</p>\n\n'
                    f"This lesson's kernels have not been timed on a GPU yet: its figure and table appear here "
                    f"once `./course bench {name[:2]} --json` has run on one and site/data/bench/{name}.json is "
                    f"committed. Until then the home page lists the lesson as being written.\n\n</div>\n")
        if pending:
            log.warning(f"{page.file.src_uri}: site/data/bench/{name}.json exists: the marker should no longer say "
                        f"pending (write <!-- bench: {name} -->)")
        if data is None:
            log.warning(f"{page.file.src_uri}: no benchmark results for {name}: run `./course bench "
                        f"{name[:2]} --json` on a GPU and commit site/data/bench/{name}.json")
            return f"*No GPU results for {name} yet.*"
        depth = page.file.src_uri.count("/")
        image = "../" * depth + f"bench/{name}.svg"
        return (f'<figure class="bench" markdown>\n![Speed of {name} relative to PyTorch on {data["gpu"]}]({image})\n'
                f"</figure>\n\n{markdown_table(data)}\n")

    return MARKER.sub(replace, markdown)
