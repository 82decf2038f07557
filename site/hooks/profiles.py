"""Nsight Compute tables on the lesson pages, made at build time from site/data/profile/NN-slug.json.

A lesson page that explains a kernel's speed writes `<!-- profile: 02-shared-memory tiled_transpose_kernel<32> -->`
where the measurement belongs: the hook replaces it with a compact table of the metrics of every profiled launch
whose kernel name matches the regular expression (searched in the short name `./course profile` prints, then the
full one). The JSON is what `./course profile NN --json` wrote on a GPU (tools/course/kernel_profile.py: "kernels",
one summary per launch), committed.

A page whose explanation is not measured yet writes `<!-- profile: NN-slug REGEX pending -->`: it renders a "not
measured yet" box (class profile-pending) naming the command, and the strict build fails once the JSON exists but the
marker still says pending. A plain marker without the JSON, or one that matches no kernel in it, fails the strict
build too (a warning, which `mkdocs build --strict` turns into a failure), as bench.py does for its markers.
"""
from __future__ import annotations

import html
import json
import logging
import os
import re
from pathlib import Path

from coursekit import trees

log = logging.getLogger("mkdocs.hooks.profiles")
# COURSE_PROFILE_DATA points the build at another folder (a test, a GPU box's fresh run); the committed data is the
# default.
DATA = Path(os.environ.get("COURSE_PROFILE_DATA") or trees.PROFILE_DATA)
MARKER = re.compile(r"<!--\s*profile:\s*([0-9]{2}-[a-z0-9-]+)\s+(\S+?)(\s+pending)?\s*-->")
MAX_COLUMNS = 4  # launches side by side; a regex that matches more shows the first ones and says how many


def load(name: str) -> dict | None:
    path = DATA / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def matching(data: dict, pattern: str) -> list[dict]:
    regex = re.compile(pattern)
    return [k for k in data.get("kernels", []) if regex.search(k.get("kernel") or "")
            or regex.search(k.get("full_name") or "")]


def _num(value, spec: str = ".1f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _kib(value) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1024:.1f} KiB" if value >= 1024 else f"{value:.0f} B"


def _cell(text: str) -> str:
    return html.escape(str(text))


def _code(text: str) -> str:
    return f"<code>{html.escape(str(text))}</code>"


def rows_of(kernel: dict) -> list[tuple[str, str]]:
    """(metric, value) for one launch, in the order a reader asks: how long, how close to which peak, how well the
    accesses use what they fetch, what is resident, what the warps wait on."""
    k = kernel
    conflicts = k.get("shared_bank_conflicts") or {}

    def conflict_text(op: str) -> str:
        c = conflicts.get(op) or {}
        if not c.get("wavefronts"):
            return "none"
        return f"{_num(c.get('conflicts'), '.0f')} ({_num(c.get('pct_of_wavefronts'), '.1f', '%')} of wavefronts)"

    limiter = " and ".join(k.get("limiter") or []) or "n/a"
    stalls = ", ".join(f"{s['reason']} {_num(s.get('share_pct'), '.0f', '%')}" for s in k.get("top_stalls") or [])
    rows = [
        ("time (ncu, base clocks)", _num(k.get("time_us"), ".1f", " us")),
        ("DRAM", f"{_num(k.get('dram_pct'), '.1f', '%')} of peak ({_num(k.get('dram_gbps'), '.0f', ' GB/s')})"),
        ("L2 / L1 / SM, % of peak", f"{_num(k.get('l2_pct'), '.1f')} / {_num(k.get('l1_pct'), '.1f')} / "
                                    f"{_num(k.get('sm_pct'), '.1f')}"),
        ("issue slots busy", _num(k.get("issue_pct"), ".1f", "%")),
        ("sectors per global load / store request", f"{_num(k.get('load_sectors_per_request'), '.1f')} / "
                                                    f"{_num(k.get('store_sectors_per_request'), '.1f')}"),
        ("shared bank conflicts, loads", conflict_text("ld")),
        ("shared bank conflicts, stores", conflict_text("st")),
        ("registers per thread; shared memory per block",
         f"{_num(k.get('registers'), '.0f')}; {_kib(k.get('shared_static_bytes'))} static + "
         f"{_kib(k.get('shared_dynamic_bytes'))} dynamic"),
        ("blocks per SM (limited by)", f"{_num(k.get('blocks_per_sm'), '.0f')} ({limiter})"),
        ("occupancy, achieved / theoretical", f"{_num(k.get('achieved_occupancy_pct'), '.1f', '%')} / "
                                              f"{_num(k.get('theoretical_occupancy_pct'), '.1f', '%')}"),
        ("top warp stalls (share of cycles per issue)", stalls or "n/a"),
    ]
    # Kernels without mma instructions still read 0.2-0.3% here (the transposes, a reduction's last pass, on an
    # H100): counter noise, not tensor-core work, so the row is shown from 1% up.
    if (k.get("tensor_pipe_pct") or 0) >= 1.0:
        rows.append(("tensor pipe, % of active cycles", _num(k.get("tensor_pipe_pct"), ".1f", "%")))
    return rows


def html_table(data: dict, kernels: list[dict], pattern: str) -> str:
    """Plain HTML, no markdown inside: a raw HTML block, for a marker on a line of its own (not indented in a list)."""
    shown = kernels[:MAX_COLUMNS]
    heads = []
    for k in shown:
        side = "" if k.get("side") in (None, "ours") else f" (baseline {k.get('baseline_name') or ''})"
        heads.append(f"<th>{_code(k.get('kernel'))}<br>{_cell((k.get('case') or 'no case') + side)}</th>")
    lines = ['<div class="profile">', "<table>", "<thead><tr><th>metric</th>" + "".join(heads) + "</tr></thead>",
             "<tbody>"]
    columns = [rows_of(k) for k in shown]
    for index, (label, _) in enumerate(columns[0]):
        cells = "".join(f'<td align="right">{_cell(col[index][1]) if index < len(col) else ""}</td>'
                        for col in columns)
        lines.append(f"<tr><td>{_cell(label)}</td>{cells}</tr>")
    lines += ["</tbody>", "</table>"]
    more = f" ({len(kernels) - len(shown)} more launches match {_code(pattern)} in the JSON.)" \
        if len(kernels) > len(shown) else ""
    lines.append(f"<p><em>Nsight Compute {_cell(data.get('ncu') or '?')} on {_cell(data.get('gpu') or '?')}, "
                 f"{_cell(data.get('date') or '?')}, by {_code(data.get('command') or '?')} (clocks: "
                 f"{_cell(data.get('clock_control') or '?')}).{more}</em></p>")
    return "\n".join(lines) + "\n</div>\n"


def pending_box(name: str, pattern: str) -> str:
    command = f"./course profile {name[:2]} --impl solutions --kernel '{pattern}' --json"
    return (f'<div class="admonition note profile-pending">\n'
            f'<p class="admonition-title">Not measured yet</p>\n'
            f"<p>The reason given here is not measured yet. On a GPU, {_code(command)} writes "
            f"{_code(f'site/data/profile/{name}.json')}, and the Nsight Compute metrics of the kernel appear in this "
            f"place.</p>\n</div>\n")


def render(name: str, pattern: str, pending: bool, where: str) -> str:
    data = load(name)
    if pending and data is None:
        return pending_box(name, pattern)
    if pending:
        log.warning(f"{where}: site/data/profile/{name}.json exists: the marker for {pattern!r} should no longer say "
                    f"pending (write <!-- profile: {name} {pattern} -->)")
    if data is None:
        log.warning(f"{where}: no profile for {name}: run `./course profile {name[:2]} --impl solutions --json` on a "
                    f"GPU and commit site/data/profile/{name}.json")
        return f"*No profile of {html.escape(name)} yet.*\n"
    try:
        kernels = matching(data, pattern)
    except re.error as error:
        log.warning(f"{where}: the profile marker's kernel {pattern!r} is not a regular expression: {error}")
        return f"*Bad kernel pattern {html.escape(pattern)}.*\n"
    if not kernels:
        names = sorted({k.get("kernel") or "?" for k in data.get("kernels", [])})
        log.warning(f"{where}: no kernel of site/data/profile/{name}.json matches {pattern!r} (it has: "
                    f"{', '.join(names) or 'none'})")
        return f"*No profiled kernel matches {html.escape(pattern)}.*\n"
    return html_table(data, kernels, pattern)


def on_page_markdown(markdown: str, page, config, files) -> str:
    where = page.file.src_uri
    return MARKER.sub(lambda m: render(m.group(1), m.group(2), bool(m.group(3)), where), markdown)
