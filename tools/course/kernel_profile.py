"""`./course profile NN`: a lab's kernels under Nsight Compute (ncu), one compact table per kernel; `--sass`: the
memory and tensor-core instructions nvcc emitted for each kernel, from cuobjdump. (Not named profile.py: that
would shadow the standard library's `profile`, which cProfile imports.)

What is profiled is the lab's perf cases, the calls its grader times (no second list of inputs to keep in step):
the perf tests run with COURSE_PROFILE set (tests/harness/perf.py), where each case calls its kernels once to warm
up, then once between cudaProfilerStart and cudaProfilerStop, and skips instead of timing. ncu runs the whole
pytest process with --profile-from-start off, so only those ranges are profiled, with a curated metric list
(METRICS) printed as a raw CSV (--csv --page raw --print-units base). Each range opens with a marker kernel
(perf.RANGE_MARKER_KERNEL) so the report's rows can be given back to the case that launched them.

Only the standard library: the CLI imports this before torch is installed.
"""
from __future__ import annotations

import csv
import datetime as _dt
import glob
import io
import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import runner

# ---------------------------------------------------------------- what is collected
# Every name is one Nsight Compute 2025.x uses in its own section files (SpeedOfLight, LaunchStats, Occupancy,
# WarpStateStats, ComputeWorkloadAnalysis, MemoryWorkloadAnalysis_Tables and the SharedMemoryConflicts rule), or a
# base counter of the L1TEX unit that the Memory Workload Analysis tables are built from, and exists from sm_75 to
# sm_90 (ncu refuses the whole run if one name is unknown on the GPU at hand; the GPU session checks them all).
THROUGHPUT = {
    "gpu__time_duration.sum": "duration",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
    "dram__bytes_read.sum": "DRAM bytes read",
    "dram__bytes_write.sum": "DRAM bytes written",
    "lts__throughput.avg.pct_of_peak_sustained_elapsed": "L2 % of peak",
    "l1tex__throughput.avg.pct_of_peak_sustained_active": "L1 % of peak",
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "SM % of peak",
    "sm__inst_issued.avg.pct_of_peak_sustained_elapsed": "issue slots busy",
}
ACCESS = {
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "global load sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "global load requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "global store sectors",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "global store requests",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "shared load bank conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "shared store bank conflicts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "shared load wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "shared store wavefronts",
}
LAUNCH = {
    "launch__registers_per_thread": "registers per thread",
    "launch__shared_mem_per_block_static": "static shared memory per block",
    "launch__shared_mem_per_block_dynamic": "dynamic shared memory per block",
    "launch__waves_per_multiprocessor": "waves per SM",
    "sm__maximum_warps_per_active_cycle_pct": "theoretical occupancy",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy",
}
# Blocks per SM that each resource allows; the smallest is the occupancy limiter.
LIMITS = {
    "launch__occupancy_limit_registers": "registers",
    "launch__occupancy_limit_shared_mem": "shared memory",
    "launch__occupancy_limit_warps": "warps (threads per block)",
    "launch__occupancy_limit_blocks": "blocks per SM",
}
TENSOR = {
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe (all)",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active": "tensor pipe (HMMA)",
}
# Warp states, in cycles per issued instruction (WarpStateStats); "selected" is issuing, not a stall.
STALL_PREFIX, STALL_SUFFIX = "smsp__average_warps_issue_stalled_", "_per_issue_active.ratio"
STALL_REASONS = ("long_scoreboard", "short_scoreboard", "barrier", "membar", "mio_throttle", "lg_throttle",
                 "math_pipe_throttle", "tex_throttle", "wait", "not_selected", "selected", "dispatch_stall", "drain",
                 "imc_miss", "no_instruction", "branch_resolving", "sleeping", "misc")
STALLS = {f"{STALL_PREFIX}{reason}{STALL_SUFFIX}": reason.replace("_", " ") for reason in STALL_REASONS}
WARP_LATENCY = "smsp__average_warp_latency_per_inst_issued.ratio"
# Metrics that exist on one architecture only (the section files' MinArch/MaxArch filters), by compute capability.
ARCH_METRICS = {"9.0": {f"{STALL_PREFIX}gmma{STALL_SUFFIX}": "gmma"}}
METRICS = {**THROUGHPUT, **ACCESS, **LAUNCH, **LIMITS, **TENSOR, **STALLS, WARP_LATENCY: "warp cycles per issued"}

# Where the tools live when they are not on PATH: the CUDA toolkit's bin/, Nsight Compute's own folders.
_TOOL_FOLDERS = ("{cuda_home}/bin", "/usr/local/cuda/bin", "/opt/nvidia/nsight-compute/*",
                 "/usr/local/cuda/nsight-compute*", "/usr/local/cuda-*/bin")


def find_tool(name: str) -> str | None:
    """`name` on PATH, else in the CUDA toolkit's or Nsight Compute's usual folders (newest first)."""
    found = shutil.which(name)
    if found:
        return found
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for pattern in _TOOL_FOLDERS:
        for folder in sorted(glob.glob(pattern.format(cuda_home=cuda_home)), reverse=True):
            candidate = Path(folder) / name
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def missing_ncu() -> str:
    return ("./course profile: needs Nsight Compute's command-line profiler `ncu`, which is not on PATH nor in "
            "/usr/local/cuda/bin or /opt/nvidia/nsight-compute/. It comes with the CUDA toolkit (the runfile installs "
            "it; from NVIDIA's apt repository: apt-get install cuda-nsight-compute-13-0, the version of your nvcc, or "
            "a standalone nsight-compute-2025.x); then put its folder on PATH, e.g. "
            "export PATH=/usr/local/cuda/bin:$PATH. `./course profile NN --sass` needs neither a GPU nor ncu.")


def missing_cuobjdump() -> str:
    return ("./course profile --sass: needs `cuobjdump` (and `nvdisasm`, which it runs), the CUDA toolkit's binary "
            "utilities: not on PATH nor in $CUDA_HOME/bin or /usr/local/cuda/bin. Install the toolkit's "
            "cuda-cuobjdump-13-0 and cuda-nvdisasm-13-0 packages (the versions of your nvcc), or "
            "pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm (they land in site-packages/nvidia/cu13/bin); "
            "then put that folder on PATH.")


NO_GPU = ("./course profile: needs a CUDA GPU the driver sees (nvidia-smi -L): Nsight Compute reads the GPU's hardware "
          "counters while the kernels run. Without one, `./course profile NN --sass` still shows the instructions nvcc "
          "emitted for each kernel.")
# ncu's own words (==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance
# Counters on the target device 0 ...) and NVIDIA's fixes (developer.nvidia.com/ERR_NVGPUCTRPERM).
PERMISSION = ("./course profile: ncu may not read the GPU's performance counters (ERR_NVGPUCTRPERM): the driver lets "
              "only administrators profile. Either run as root (sudo env PATH=$PATH ./course profile ...; in a "
              "container, start it with --cap-add=SYS_ADMIN), or let every user profile: put the line\n"
              "    options nvidia NVreg_RestrictProfilingToAdminUsers=0\n"
              "in /etc/modprobe.d/ncu-permissions.conf, rebuild the initramfs (update-initramfs -u) and reboot. "
              "cat /proc/driver/nvidia/params | grep RmProfilingAdminOnly shows the setting (1: admins only). "
              "See https://developer.nvidia.com/ERR_NVGPUCTRPERM")


# ---------------------------------------------------------------- the ncu report
def _number(text: str) -> float | None:
    """A metric's value as ncu prints it ("1,234,567", "92.41", "n/a") as a float, or None."""
    text = text.strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return None


def _is_metric(column: str) -> bool:
    return bool(re.fullmatch(r"[a-z0-9]+__[a-z0-9_]+(\.[a-z0-9_]+)*", column))


def parse_csv(text: str) -> list[dict]:
    """The kernels of `ncu --csv --page raw` output, in launch order: each {"id", "kernel", "block", "grid",
    "device", "cc", "metrics": {name: value}, "units": {name: unit}}. The report is the header row ("ID",
    "Process ID", ..., "Kernel Name", ..., then one column per metric), a units row (blank under the launch
    columns) and one row per profiled kernel; ncu's own ==PROF==/==WARNING== lines around it are skipped."""
    lines = [line for line in text.splitlines() if line.strip() and not line.startswith("==")]
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.reader(io.StringIO("\n".join(lines[start:]))))
    header, body = rows[0], rows[1:]
    units = {}
    if body and body[0] and body[0][0] == "":
        units = {name: unit for name, unit in zip(header, body[0]) if _is_metric(name)}
        body = body[1:]
    kernels = []
    for row in body:
        if len(row) != len(header):
            continue
        cells = dict(zip(header, row))
        kernels.append({
            "id": int(_number(cells.get("ID", "")) or 0),
            "kernel": cells.get("Kernel Name", ""),
            "block": cells.get("Block Size", ""),
            "grid": cells.get("Grid Size", ""),
            "device": cells.get("Device", ""),
            "cc": cells.get("CC", ""),
            "metrics": {name: _number(value) for name, value in cells.items() if _is_metric(name)},
            "units": {name: units.get(name, "") for name in cells if _is_metric(name)},
        })
    return sorted(kernels, key=lambda k: k["id"])


def short_name(kernel: str) -> str:
    """A demangled kernel name without its return type and parameter list: `void f<4>(const float *, int)` ->
    `f<4>`; a name without parameters (ncu's function base) stays as it is."""
    name = kernel.strip()
    if name.endswith(")"):
        depth = 0
        for index in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[index], 0)
            if depth == 0:
                name = name[:index]
                break
    return name.removeprefix("void ").strip()


def split_ranges(kernels: list[dict], ranges: list[dict], marker: str) -> list[dict]:
    """Give each profiled kernel the case and side of the range it ran in. Each range's first kernel is the
    marker; the ranges come in the order the harness recorded them (its `profiled` list). The markers
    themselves are dropped. If the counts disagree (a range whose marker ncu did not keep), the kernels
    keep no case rather than a wrong one."""
    groups: list[list[dict]] = []
    for kernel in kernels:
        if marker in kernel["kernel"]:
            groups.append([])
        elif groups:
            groups[-1].append(kernel)
        else:  # before any marker: no range to give it
            groups.append([kernel])
    labelled = len(groups) == len(ranges) and all(marker in k["kernel"] for k in kernels[:1])
    out = []
    for index, group in enumerate(groups):
        where = ranges[index] if labelled else {}
        for kernel in group:
            out.append(dict(kernel, case=where.get("case"), side=where.get("side"),
                            baseline_name=where.get("baseline_name")))
    return out


# Unit strings as ncu writes them: Nsight Compute 2025.3 with --print-units base writes "ns" (an H100, 2026-11-26);
# other versions and pages spell them out.
_TIME_SCALE = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3, "s": 1e6,
               "second": 1e6}
_BYTE_SCALE = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _value(kernel: dict, name: str) -> float | None:
    return kernel["metrics"].get(name)


def _scaled(kernel: dict, name: str, scales: dict, default: float = 1) -> float | None:
    """The metric in the table's unit; a unit the table does not know (or none) counts as `default`."""
    value = _value(kernel, name)
    if value is None:
        return None
    return value * scales.get(kernel["units"].get(name, ""), default)


def summarize(kernel: dict) -> dict:
    """What a student reads off one kernel: time, throughput as % of peak, access efficiency, occupancy and its
    limiter, the top stalls, the tensor pipe. Each value None where ncu did not report it."""
    # --print-units base reports durations in nanoseconds, whatever the unit column calls them.
    time_us = _scaled(kernel, "gpu__time_duration.sum", _TIME_SCALE, default=1e-3)
    read, written = (_scaled(kernel, n, _BYTE_SCALE) for n in ("dram__bytes_read.sum", "dram__bytes_write.sum"))
    dram_gbps = ((read or 0) + (written or 0)) / (time_us * 1e3) if time_us and read is not None else None

    def ratio(numerator: str, denominator: str) -> float | None:
        top, bottom = _value(kernel, numerator), _value(kernel, denominator)
        return top / bottom if top is not None and bottom else None

    limits = {label: _value(kernel, name) for name, label in LIMITS.items() if _value(kernel, name) is not None}
    fewest = min(limits.values()) if limits else None
    stalls = {label: _value(kernel, name) for name, label in {**STALLS, **_arch_stalls()}.items()
              if _value(kernel, name) is not None}
    total = _value(kernel, WARP_LATENCY) or sum(stalls.values()) or None
    top = sorted(((label, value) for label, value in stalls.items() if label != "selected" and value > 0),
                 key=lambda item: -item[1])[:3]
    conflicts = {}
    for op in ("ld", "st"):
        count = _value(kernel, f"l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_{op}.sum")
        wavefronts = _value(kernel, f"l1tex__data_pipe_lsu_wavefronts_mem_shared_op_{op}.sum")
        conflicts[op] = {"conflicts": count, "wavefronts": wavefronts,
                         "pct_of_wavefronts": 100 * count / wavefronts if count is not None and wavefronts else None}
    return {
        "kernel": short_name(kernel["kernel"]),
        "full_name": kernel["kernel"],
        "case": kernel.get("case"),
        "side": kernel.get("side"),
        "baseline_name": kernel.get("baseline_name"),
        "grid": kernel["grid"],
        "block": kernel["block"],
        "cc": kernel["cc"],
        "time_us": time_us,
        "dram_gbps": dram_gbps,
        "dram_pct": _value(kernel, "dram__throughput.avg.pct_of_peak_sustained_elapsed"),
        "l2_pct": _value(kernel, "lts__throughput.avg.pct_of_peak_sustained_elapsed"),
        "l1_pct": _value(kernel, "l1tex__throughput.avg.pct_of_peak_sustained_active"),
        "sm_pct": _value(kernel, "sm__throughput.avg.pct_of_peak_sustained_elapsed"),
        "issue_pct": _value(kernel, "sm__inst_issued.avg.pct_of_peak_sustained_elapsed"),
        "load_sectors_per_request": ratio("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                                          "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
        "store_sectors_per_request": ratio("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                                           "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
        "shared_bank_conflicts": conflicts,
        "registers": _value(kernel, "launch__registers_per_thread"),
        "shared_static_bytes": _value(kernel, "launch__shared_mem_per_block_static"),
        "shared_dynamic_bytes": _value(kernel, "launch__shared_mem_per_block_dynamic"),
        "waves_per_sm": _value(kernel, "launch__waves_per_multiprocessor"),
        "theoretical_occupancy_pct": _value(kernel, "sm__maximum_warps_per_active_cycle_pct"),
        "achieved_occupancy_pct": _value(kernel, "sm__warps_active.avg.pct_of_peak_sustained_active"),
        "blocks_per_sm": fewest,
        "limiter": [label for label, value in limits.items() if value == fewest],
        "block_limits": limits,
        "warp_cycles_per_issue": total,
        "top_stalls": [{"reason": label, "cycles_per_issue": value,
                        "share_pct": 100 * value / total if total else None} for label, value in top],
        "tensor_pipe_pct": _value(kernel, "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active"),
        "hmma_pipe_pct": _value(kernel, "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
        "metrics": kernel["metrics"],
    }


def _arch_stalls() -> dict:
    return {name: label for extra in ARCH_METRICS.values() for name, label in extra.items() if name.startswith(
        STALL_PREFIX)}


def _fmt(value: float | None, spec: str = ".1f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def _bytes(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value / 1024:.1f} KiB" if value >= 1024 else f"{value:.0f} B"


def _geometry(text: str) -> str:
    """ncu's "(256, 1, 1)" as 256x1x1."""
    parts = re.findall(r"\d+", text)
    return "x".join(parts) if parts else text or "?"


def format_table(summary: dict) -> str:
    """One kernel as the block of lines `./course profile` prints."""
    s = summary
    where = f"  [{s['case']}{'' if s['side'] in (None, 'ours') else ', baseline: ' + (s['baseline_name'] or '')}]" \
        if s.get("case") else ""
    cases = s.get("also_cases")
    lines = [f"-- {s['kernel']}{where}"]
    if cases:
        lines.append(f"   (the same launch in: {'; '.join(cases)})")
    lines.append(f"   launch      grid {_geometry(s['grid'])}, block {_geometry(s['block'])}, "
                 f"{_fmt(s['waves_per_sm'], '.2f')} waves/SM")
    lines.append(f"   time        {_fmt(s['time_us'], '.1f', ' us')}")
    lines.append(f"   throughput  DRAM {_fmt(s['dram_pct'], '.1f', '%')} of peak "
                 f"({_fmt(s['dram_gbps'], '.0f', ' GB/s')}), L2 {_fmt(s['l2_pct'], '.1f', '%')}, "
                 f"L1 {_fmt(s['l1_pct'], '.1f', '%')}, "
                 f"SM {_fmt(s['sm_pct'], '.1f', '%')}, issue slots {_fmt(s['issue_pct'], '.1f', '%')} busy")
    lines.append(f"   global      {_fmt(s['load_sectors_per_request'], '.1f')} sectors per load request, "
                 f"{_fmt(s['store_sectors_per_request'], '.1f')} per store request")
    conflicts = s["shared_bank_conflicts"]
    if any(conflicts[op]["wavefronts"] for op in ("ld", "st")):
        text = ", ".join(f"{'loads' if op == 'ld' else 'stores'} {_fmt(conflicts[op]['conflicts'], '.0f')} "
                         f"({_fmt(conflicts[op]['pct_of_wavefronts'], '.1f', '%')} of wavefronts)"
                         for op in ("ld", "st"))
        lines.append(f"   shared      bank conflicts: {text}")
    else:
        lines.append("   shared      no shared-memory loads or stores")
    limiter = " and ".join(s["limiter"]) if s["limiter"] else "n/a"
    lines.append(f"   occupancy   achieved {_fmt(s['achieved_occupancy_pct'], '.1f', '%')} of the warps an SM holds, "
                 f"theoretical {_fmt(s['theoretical_occupancy_pct'], '.1f', '%')}: "
                 f"{_fmt(s['blocks_per_sm'], '.0f')} blocks/SM, limited by {limiter}")
    lines.append(f"   resources   {_fmt(s['registers'], '.0f')} registers/thread, shared memory "
                 f"{_bytes(s['shared_static_bytes'])} static + {_bytes(s['shared_dynamic_bytes'])} dynamic per block")
    stalls = ", ".join(f"{t['reason']} {t['cycles_per_issue']:.1f} ({_fmt(t['share_pct'], '.0f', '%')})"
                       for t in s["top_stalls"]) or "n/a"
    lines.append(f"   stalls      {stalls}, of {_fmt(s['warp_cycles_per_issue'], '.1f')} cycles per issued instruction")
    if s["tensor_pipe_pct"]:
        lines.append(f"   tensor pipe {_fmt(s['tensor_pipe_pct'], '.1f', '%')} of active cycles "
                     f"(HMMA {_fmt(s['hmma_pipe_pct'], '.1f', '%')})")
    return "\n".join(lines)


LEGEND = ("How to read them: times are ncu's, at the base clocks it locks the GPU to (./course bench times at the "
          "GPU's own clocks); % of peak is of the unit's sustained peak over the kernel's run. A request is one "
          "warp's load or store instruction; it touches 32-byte sectors: 4 for a warp of coalesced 4-byte accesses, "
          "16 for 16-byte ones, 32 when each thread's 4 bytes sit in a sector of their own. A bank conflict is a "
          "shared-memory wavefront replayed because two threads of a warp hit one bank. Occupancy: the warps "
          "resident per SM, as % of the most it can hold; the limiter is the resource that allows the fewest blocks "
          "per SM. Stalls: the cycles a warp spent in each state per instruction it issued (the top three, and their"
          " share of all).")


def merge_repeats(summaries: list[dict]) -> list[dict]:
    """One table per distinct launch (kernel, grid, block, side): two perf cases timing the same call (lab 05's
    kernel against two baselines) show once, naming both cases."""
    seen: dict[tuple, dict] = {}
    out = []
    for summary in summaries:
        key = (summary["full_name"], summary["grid"], summary["block"], summary["side"])
        if key in seen:
            if summary["case"] and summary["case"] != seen[key]["case"]:
                seen[key].setdefault("also_cases", []).append(summary["case"])
            continue
        seen[key] = summary
        out.append(summary)
    return out


def ncu_problem(log_text: str) -> str | None:
    """What went wrong in ncu's own words: the permission error (with its fix), else its ==ERROR== lines."""
    if "ERR_NVGPUCTRPERM" in log_text:
        return PERMISSION
    errors = [line.strip() for line in log_text.splitlines() if line.startswith("==ERROR==")]
    return "ncu reported:\n  " + "\n  ".join(errors[:8]) if errors else None


def ncu_command(ncu: str, csv_path: Path, *, kernel: str | None, cc: str | None) -> list[str]:
    metrics = {**METRICS, **ARCH_METRICS.get(cc or "", {})}
    command = [ncu, "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base",
               "--metrics", ",".join(metrics), "--log-file", str(csv_path)]
    if kernel:  # the marker kernel must pass the filter too: it is how rows find their case
        command += ["--kernel-name", f"regex:{kernel}|{MARKER}"]
    return command


# tests/harness/perf.py's RANGE_MARKER_KERNEL and PROFILE_ENV (tests/test_course_profile.py checks they agree).
MARKER = "spin_kernel"
PROFILE_ENV = "COURSE_PROFILE"


def gpu_facts() -> dict:
    """The GPU's name and compute capability from nvidia-smi (the profile runs outside torch)."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30).stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if not out or "," not in out[0]:
        return {}
    name, cc = (part.strip() for part in out[0].split(",", 1))
    return {"gpu": name, "cc": cc}


def tool_version(tool: str) -> str | None:
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"Version\s+(\S+)", out)
    return match.group(1) if match else None


def profile(python: str, lab, impl: str, *, kernel: str | None = None, select: str | None = None,
            baseline: bool = False, json_out: str | None = None, deadline_s: int = 3600) -> int:
    """Build the lab, run its perf cases under ncu, print a table per kernel; 0 when at least one kernel was
    profiled."""
    ncu = find_tool("ncu")
    if not ncu:
        print(missing_ncu())
        return 2
    if not runner.gpu_visible():
        print(NO_GPU)
        return 2
    if shutil.which("ncu") != ncu:
        print(f"[course] using {ncu} (not on PATH)")
    if build(python, lab, impl) != 0:
        return 1
    facts = gpu_facts()
    csv_path = runner.trees.LOGS / f"profile-{lab.name}.csv"
    runner.trees.LOGS.mkdir(parents=True, exist_ok=True)
    csv_path.unlink(missing_ok=True)
    command = ncu_command(ncu, csv_path, kernel=kernel, cc=facts.get("cc"))
    selection = ["-m", "perf", *(["-k", select] if select else [])]
    print(f"[course] profiling {lab.name}'s perf cases under Nsight Compute (ncu replays each kernel once per "
          "metric pass, with the clocks locked to base: the times are ncu's, not ./course bench's) ...", flush=True)
    result = runner.run_pytest(python, [lab.test_file], impl=impl, label=f"profile-{lab.name}", lab_number=lab.number,
                               verbose=False, deadline_s=deadline_s, pytest_args=selection, wrapper=command,
                               extra_env={PROFILE_ENV: "ours,baseline" if baseline else "ours"})
    report_text = csv_path.read_text(errors="replace") if csv_path.exists() else ""
    log_text = Path(result["log"]).read_text(errors="replace") if Path(result["log"]).exists() else ""
    kernels = split_ranges(parse_csv(report_text), result.get("profiled", []), MARKER)
    if kernel:
        kernels = [k for k in kernels if re.search(kernel, k["kernel"])]
    problem = ncu_problem(report_text + "\n" + log_text)
    if not kernels:
        skipped = [t["message"] for t in result.get("tests", []) if t["outcome"] == "skipped"
                   and "profiled under" not in t["message"]]
        failed = [f"{t['name']}: {t['message'].splitlines()[0] if t['message'] else ''}"
                  for t in result.get("tests", []) if t["outcome"] == "failed"]
        why = problem or result.get("error") or (f"failed: {failed[0]}" if failed else None) or \
            (f"every perf test was skipped: {skipped[0]}" if skipped else None) or \
            ("no kernel matched --kernel " + kernel if kernel else "ncu profiled no kernel")
        print(f"./course profile: nothing profiled for {lab.name}: {why}\n  (pytest's output: {result['log']}; "
              f"ncu's report: {csv_path})")
        return 1
    summaries = merge_repeats([summarize(k) for k in kernels])
    version = tool_version(ncu)
    print(f"\n{lab.name} ({impl}) on {facts.get('gpu', 'the GPU')}, Nsight Compute {version or '?'}: "
          f"{len(summaries)} kernel(s)\n")
    for summary in summaries:
        print(format_table(summary) + "\n")
    print(textwrap.fill(LEGEND, width=118) + "\n")
    if problem:
        print(problem)
    if json_out:
        data = {"lab": lab.name, "impl": impl, "gpu": facts.get("gpu"), "cc": facts.get("cc"), "ncu": version,
                "date": _dt.date.today().isoformat(), "clock_control": "base (ncu's default)",
                "command": f"./course profile {lab.number} --impl {impl}" + (f" --kernel {kernel}" if kernel else "")
                + (f" -k {select}" if select else "") + (" --baseline" if baseline else ""),
                "kernels": summaries}
        write_json(Path(json_out), data)
        print(f"[course] wrote {json_out}")
    return 0


def build(python: str, lab, impl: str) -> int:
    """Compile the lab as the grader does (outside ncu, so the compilers are not traced)."""
    command = [python, "-W", "ignore::RuntimeWarning:runpy", "-m", "harness.build", lab.number, "--impl", impl]
    path = runner.trees.pythonpath(os.environ.get("PYTHONPATH"))
    return subprocess.run(command, cwd=runner.trees.ROOT, env=dict(os.environ, PYTHONPATH=path)).returncode


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")


# ---------------------------------------------------------------- SASS
# The opcodes `--sass` keeps: global, shared and tensor-memory traffic, the async copies (cp.async: LDGSTS; TMA:
# UTMALDG/UTMASTG/UBLKCP), ldmatrix/stmatrix (LDSM/STSM), atomics and reductions, and the tensor-core MMAs.
SASS_KEEP = re.compile(r"^(LDG|STG|LDS|STS|LDGSTS|LDGDEPBAR|LDSM|STSM|LD|ST|ATOM|ATOMG|ATOMS|RED|REDUX|HMMA|HGMMA|IMMA|"
                       r"DMMA|WARPGROUP|UTMALDG|UTMASTG|UTMAPF|UBLKCP|SYNCS|BAR)(\.|$)")
_SASS_LINE = re.compile(r"^\s*/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Za-z0-9_]+)*)")


def parse_sass(text: str) -> list[dict]:
    """cuobjdump -sass output as one entry per (arch, function): {"arch", "function" (mangled), "instructions"
    (every opcode with its modifiers, in program order)}."""
    functions: list[dict] = []
    arch = None
    for line in text.splitlines():
        target = re.match(r"\s*code for (sm_\w+)", line)
        if target:
            arch = target.group(1)
            continue
        header = re.match(r"\s*Function : (\S+)", line)
        if header:
            functions.append({"arch": arch, "function": header.group(1), "instructions": []})
            continue
        op = _SASS_LINE.match(line)
        if op and functions:
            functions[-1]["instructions"].append(op.group(1))
    return functions


def demangle(names: list[str]) -> dict[str, str]:
    """Itanium-mangled names (nvcc's) demangled by cu++filt or c++filt, one process for all; unchanged without."""
    tool = find_tool("cu++filt") or shutil.which("c++filt")
    if not tool or not names:
        return {name: name for name in names}
    try:
        out = subprocess.run([tool], input="\n".join(names) + "\n", capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {name: name for name in names}
    lines = out.splitlines()
    return dict(zip(names, lines)) if len(lines) == len(names) else {name: name for name in names}


def sass_summary(function: dict, name: str) -> dict:
    """The kept instructions of one function: counts per opcode, and the program-order sequence with runs of
    one opcode folded (`LDG.E.128.CONSTANT x4` before `STG.E.128 x4` shows a 4x unrolled vector copy)."""
    kept = [op for op in function["instructions"] if SASS_KEEP.match(op)]
    counts: dict[str, int] = {}
    for op in kept:
        counts[op] = counts.get(op, 0) + 1
    runs: list[list] = []
    for op in kept:
        if runs and runs[-1][0] == op:
            runs[-1][1] += 1
        else:
            runs.append([op, 1])
    return {"kernel": name, "mangled": function["function"], "arch": function["arch"],
            "instructions": len(function["instructions"]), "counts": dict(sorted(counts.items())),
            "sequence": [f"{op} x{n}" if n > 1 else op for op, n in runs]}


def format_sass(summary: dict, max_sequence: int = 48) -> str:
    s = summary
    lines = [f"-- {s['kernel']}  [{s['arch']}, {s['instructions']} instructions]"]
    if not s["counts"]:
        lines.append("   no memory or tensor-core instructions")
        return "\n".join(lines)
    lines.append("   counts      " + ", ".join(f"{op} {n}" for op, n in s["counts"].items()))
    sequence = s["sequence"]
    shown = ", ".join(sequence[:max_sequence]) + (f", ... ({len(sequence) - max_sequence} more)"
                                                  if len(sequence) > max_sequence else "")
    lines.append(f"   in order    {shown}")
    return "\n".join(lines)


def built_extension(lab, tree) -> Path | None:
    """The lab's compiled extension (the grader's build folder), if it exists."""
    found = sorted(lab.build_dir(tree).glob("*.so"))
    return found[0] if found else None


def sass(python: str, lab, impl: str, *, kernel: str | None = None, json_out: str | None = None) -> int:
    """Build the lab and print each kernel's memory and MMA instructions; runs without a GPU."""
    cuobjdump = find_tool("cuobjdump")
    if not cuobjdump:
        print(missing_cuobjdump())
        return 2
    if build(python, lab, impl) != 0:
        return 1
    tree = runner.trees.resolve_tree(impl)
    library = built_extension(lab, tree)
    if library is None:
        print(f"./course profile --sass: the build left no extension in {lab.build_dir(tree)}")
        return 1
    environment = dict(os.environ, PATH=os.pathsep.join([str(Path(cuobjdump).parent), os.environ.get("PATH", "")]))
    run = subprocess.run([cuobjdump, "-sass", str(library)], capture_output=True, text=True, env=environment)
    if run.returncode != 0:
        print(f"./course profile --sass: cuobjdump failed on {library}:\n{(run.stderr or run.stdout)[-2000:]}")
        if "nvdisasm" in (run.stderr + run.stdout):
            print(missing_cuobjdump())
        return 1
    functions = parse_sass(run.stdout)
    names = demangle(sorted({f["function"] for f in functions}))
    summaries = [sass_summary(f, names[f["function"]]) for f in functions]
    if kernel:
        summaries = [s for s in summaries if re.search(kernel, s["kernel"]) or re.search(kernel, s["mangled"])]
    if not summaries:
        print(f"./course profile --sass: no kernel of {library.name}" + (f" matches {kernel!r}" if kernel else ""))
        return 1
    shown = library.relative_to(runner.trees.ROOT) if library.is_relative_to(runner.trees.ROOT) else library
    print(f"\n{lab.name} ({impl}): the memory and tensor-core instructions of {len(summaries)} kernel(s), from "
          f"cuobjdump -sass {shown}\n")
    for summary in summaries:
        print(format_sass(summary) + "\n")
    if json_out:
        write_json(Path(json_out), {"lab": lab.name, "impl": impl, "date": _dt.date.today().isoformat(),
                                    "command": f"./course profile {lab.number} --impl {impl} --sass"
                                    + (f" --kernel {kernel}" if kernel else ""), "sass": summaries})
        print(f"[course] wrote {json_out}")
    return 0
