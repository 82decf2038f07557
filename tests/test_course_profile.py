"""`./course profile` (tools/course/kernel_profile.py): the ncu report parser, the tables, the SASS filter and the
messages for a machine that lacks a tool, on CPU; the real run on a GPU.

tests/data/profile/ncu-raw-report.csv is written by hand in the layout of `ncu --csv --page raw --print-units base
--log-file F` (ncu's ==PROF== lines, a header row of launch columns and metric names, a units row, one row per
kernel, thousands separators, n/a), with the metric list of kernel_profile.METRICS and H100-like values: five
profiled ranges, each opened by the marker kernel. It was not recorded on a GPU: test_profile_runs_on_the_gpu
checks the same parser against ncu's real output. tests/data/profile/cuobjdump-sass-excerpt.txt is real
`cuobjdump -sass` output (cuobjdump 13.2) of this course's lab 01 and lab 05 solution builds for sm_90a:
copy_coalesced_kernel whole, and the HGMMA stretch of linear_act_wgmma_kernel<__nv_bfloat16>.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import kernel_profile  # noqa: E402
import pytest

from coursekit import trees
from harness import HAS_GPU, NO_GPU_REASON, perf
from harness.check import GradeFailure

DATA = Path(__file__).parent / "data" / "profile"
COURSE = str(trees.ROOT / "course")
CLI = str(trees.ROOT / "tools" / "course" / "cli.py")  # run by this python, so PATH can be emptied of the CUDA tools
# ... with the PYTHONPATH the ./course launcher gives it (coursekit, harness)
CLI_PATH = trees.pythonpath(os.environ.get("PYTHONPATH"))
# The ranges the harness recorded for the report's five markers (perf.PROFILED, as conftest writes it out).
RANGES = [
    {"case": "ladder 3: float4 copy", "side": "ours", "baseline_name": "dst.copy_(src)"},
    {"case": "sum 2^28 fp32", "side": "ours", "baseline_name": "torch.sum"},
    {"case": "sum 2^28 fp32", "side": "baseline", "baseline_name": "torch.sum"},
    {"case": "tiled transpose 8192x8192 fp32 vs copy", "side": "ours", "baseline_name": "dst.copy_(src)"},
    {"case": "tiled transpose 8192x8192 fp32 vs torch", "side": "ours", "baseline_name": "x.t().contiguous()"},
]


@pytest.fixture(scope="module")
def kernels():
    return kernel_profile.split_ranges(kernel_profile.parse_csv((DATA / "ncu-raw-report.csv").read_text()), RANGES,
                                       kernel_profile.MARKER)


def test_the_marker_is_the_harness_marker():
    assert kernel_profile.MARKER == perf.RANGE_MARKER_KERNEL and kernel_profile.PROFILE_ENV == perf.PROFILE_ENV
    assert kernel_profile.split_ranges([], [], kernel_profile.MARKER) == []


def test_parser_reads_header_units_and_rows():
    rows = kernel_profile.parse_csv((DATA / "ncu-raw-report.csv").read_text())
    assert [r["id"] for r in rows] == list(range(11))
    vec = rows[1]
    assert vec["kernel"] == "copy_vectorized_kernel(const float *, float *, VectorSplit)"
    assert vec["block"] == "(256, 1, 1)" and vec["grid"] == "(792, 1, 1)" and vec["cc"] == "9.0"
    assert vec["metrics"]["dram__bytes_read.sum"] == 1_073_790_464  # "1,073,790,464"
    assert vec["units"]["gpu__time_duration.sum"] == "nsecond"
    assert rows[0]["metrics"]["dram__throughput.avg.pct_of_peak_sustained_elapsed"] is None  # n/a
    assert set(kernel_profile.METRICS) <= set(vec["metrics"])


def test_parser_ignores_everything_but_the_report():
    assert kernel_profile.parse_csv("==PROF== Connected to process 1\n==WARNING== No kernels were profiled.\n") == []


def test_ranges_give_each_kernel_its_case_and_drop_the_markers(kernels):
    assert [(k["id"], k["case"], k["side"]) for k in kernels] == [
        (1, "ladder 3: float4 copy", "ours"),
        (3, "sum 2^28 fp32", "ours"), (4, "sum 2^28 fp32", "ours"),
        (6, "sum 2^28 fp32", "baseline"),
        (8, "tiled transpose 8192x8192 fp32 vs copy", "ours"),
        (10, "tiled transpose 8192x8192 fp32 vs torch", "ours")]


def test_ranges_that_do_not_match_leave_the_case_empty():
    rows = kernel_profile.parse_csv((DATA / "ncu-raw-report.csv").read_text())
    kernels = kernel_profile.split_ranges(rows, RANGES[:3], kernel_profile.MARKER)
    assert len(kernels) == 6 and all(k["case"] is None for k in kernels)


def test_summary_of_a_memory_bound_kernel(kernels):
    s = kernel_profile.summarize(kernels[0])
    assert s["kernel"] == "copy_vectorized_kernel"
    assert s["time_us"] == pytest.approx(716.448)
    assert s["dram_gbps"] == pytest.approx((1_073_790_464 + 1_073_745_920) / 716_448, rel=1e-9)  # bytes/ns = GB/s
    assert s["dram_pct"] == pytest.approx(90.12)
    assert s["load_sectors_per_request"] == 16 and s["store_sectors_per_request"] == 16
    assert s["blocks_per_sm"] == 6 and s["limiter"] == ["registers"]
    assert [t["reason"] for t in s["top_stalls"]] == ["long scoreboard", "lg throttle", "wait"]
    assert s["top_stalls"][0]["share_pct"] == pytest.approx(100 * 28.41 / 40.24)
    assert not s["tensor_pipe_pct"]


@pytest.mark.parametrize("unit", ["ns", "", "a unit the table does not know"])
def test_time_in_any_other_unit_is_taken_as_ncus_base_unit_nanoseconds(kernels, unit):
    # --print-units base reports nanoseconds; the first H100 profiles (ncu 2025.3) came out 1000x slow and 1000x
    # short of bandwidth with a fallback of 1 (780512 "us" and 2.7 "GB/s" for a 2 GiB copy).
    kernel = dict(kernels[0], units=dict(kernels[0]["units"], **{"gpu__time_duration.sum": unit}))
    s = kernel_profile.summarize(kernel)
    assert s["time_us"] == pytest.approx(716.448)
    assert s["dram_gbps"] == pytest.approx((1_073_790_464 + 1_073_745_920) / 716_448, rel=1e-9)
    assert kernel_profile.summarize(dict(kernels[0], units={}))["time_us"] == pytest.approx(716.448)


def test_summary_names_every_limiter_that_ties(kernels):
    s = kernel_profile.summarize(kernels[1])  # partial sums: 8 blocks/SM by registers and by warps
    assert s["kernel"] == "partial_sums_kernel<float, false>"
    assert s["limiter"] == ["registers", "warps (threads per block)"]


def test_summary_of_a_bank_conflicted_kernel(kernels):
    s = kernel_profile.summarize(kernels[4])
    conflicts = s["shared_bank_conflicts"]
    assert conflicts["ld"]["pct_of_wavefronts"] == pytest.approx(100 * 65_011_712 / 67_108_864)
    assert conflicts["st"]["conflicts"] == 0
    assert s["top_stalls"][0]["reason"] == "mio throttle"


def test_table_reads_as_the_student_sees_it(kernels):
    table = kernel_profile.format_table(kernel_profile.summarize(kernels[0]))
    print(table)
    assert table.splitlines()[0] == "-- copy_vectorized_kernel  [ladder 3: float4 copy]"
    for text in ("grid 792x1x1, block 256x1x1", "716.4 us", "DRAM 90.1% of peak (2997 GB/s)", "L2 71.3%",
                 "16.0 sectors per load request", "no shared-memory loads or stores", "achieved 71.9%",
                 "theoretical 75.0%: 6 blocks/SM, limited by registers", "40 registers/thread",
                 "long scoreboard 28.4 (71%)", "of 40.2 cycles per issued instruction"):
        assert text in table, text
    assert "tensor pipe" not in table
    conflicted = kernel_profile.format_table(kernel_profile.summarize(kernels[4]))
    assert "bank conflicts: loads 65011712 (96.9% of wavefronts), stores 0 (0.0% of wavefronts)" in conflicted
    baseline = kernel_profile.format_table(kernel_profile.summarize(kernels[3]))
    assert baseline.splitlines()[0].endswith("[sum 2^28 fp32, baseline: torch.sum]")


def test_a_kernel_with_nothing_reported_prints_n_a():
    empty = {"kernel": "k(int)", "block": "", "grid": "", "cc": "", "metrics": {}, "units": {}}
    table = kernel_profile.format_table(kernel_profile.summarize(empty))
    assert "time        n/a" in table and "limited by n/a" in table


def test_the_same_launch_in_two_cases_prints_once(kernels):
    merged = kernel_profile.merge_repeats([kernel_profile.summarize(k) for k in kernels])
    assert [s["kernel"] for s in merged].count("tiled_transpose_kernel<32>") == 1
    transpose = next(s for s in merged if s["kernel"] == "tiled_transpose_kernel<32>")
    assert transpose["also_cases"] == ["tiled transpose 8192x8192 fp32 vs torch"]
    assert "(the same launch in: tiled transpose 8192x8192 fp32 vs torch)" in kernel_profile.format_table(transpose)
    json.dumps(merged)  # what --json writes


def test_short_name_strips_the_return_type_and_parameters():
    assert kernel_profile.short_name("void f<(int)4>(const float *, int)") == "f<(int)4>"
    assert kernel_profile.short_name("at::cuda::<unnamed>::spin_kernel(long)") == "at::cuda::<unnamed>::spin_kernel"
    assert kernel_profile.short_name("copy_coalesced_kernel") == "copy_coalesced_kernel"


def test_ncu_command_profiles_only_the_ranges():
    command = kernel_profile.ncu_command("ncu", Path("out.csv"), kernel="copy_vec", cc="9.0")
    assert command[:3] == ["ncu", "--profile-from-start", "off"]
    metrics = command[command.index("--metrics") + 1].split(",")
    assert "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio" in metrics  # Hopper only
    assert command[command.index("--kernel-name") + 1] == "regex:copy_vec|spin_kernel"
    plain = kernel_profile.ncu_command("ncu", Path("out.csv"), kernel=None, cc="7.5")
    assert "--kernel-name" not in plain and "gmma" not in plain[plain.index("--metrics") + 1]


def test_ncu_problems_in_its_own_words():
    denied = ("==ERROR== ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance "
              "Counters on the target device 0. For instructions on enabling permissions and to get more "
              "information see https://developer.nvidia.com/ERR_NVGPUCTRPERM")
    message = kernel_profile.ncu_problem(denied)
    assert "NVreg_RestrictProfilingToAdminUsers=0" in message and "sudo" in message
    assert kernel_profile.ncu_problem("==ERROR== Failed to find metric foo__bar.sum\n") == (
        "ncu reported:\n  ==ERROR== Failed to find metric foo__bar.sum")
    assert kernel_profile.ncu_problem("==PROF== Disconnected from process 1") is None


# ---------------------------------------------------------------- SASS
@pytest.fixture(scope="module")
def sass_functions():
    return kernel_profile.parse_sass((DATA / "cuobjdump-sass-excerpt.txt").read_text())


def test_sass_parser_finds_each_function_and_its_arch(sass_functions):
    assert [f["arch"] for f in sass_functions] == ["sm_90a", "sm_90a"]
    assert sass_functions[0]["function"] == "_Z21copy_coalesced_kernelPKfPfl"
    assert "linear_act_wgmma_kernelI13__nv_bfloat16" in sass_functions[1]["function"]
    assert len(sass_functions[0]["instructions"]) == 216


def test_sass_filter_shows_the_unrolled_copy(sass_functions):
    """The grid-stride copy nvcc unrolled 4x: four loads issued before the first of four stores."""
    summary = kernel_profile.sass_summary(sass_functions[0], "copy_coalesced_kernel(float const*, float*, long)")
    assert summary["counts"] == {"LDG.E.CONSTANT": 5, "STG.E": 5}
    assert summary["sequence"] == ["LDG.E.CONSTANT", "STG.E", "LDG.E.CONSTANT x4", "STG.E x4"]
    text = kernel_profile.format_sass(summary)
    assert "in order    LDG.E.CONSTANT, STG.E, LDG.E.CONSTANT x4, STG.E x4" in text


def test_sass_filter_keeps_the_tensor_core_and_tma_instructions(sass_functions):
    summary = kernel_profile.sass_summary(sass_functions[1], "linear_act_wgmma_kernel<__nv_bfloat16>")
    assert summary["counts"]["HGMMA.64x256x16.F32.BF16"] == 4  # lower-case modifiers kept whole
    assert "WARPGROUP.ARRIVE" in summary["counts"]
    assert not any(op.startswith(("IMAD", "MOV", "UMOV", "BRA")) for op in summary["counts"])


def test_sass_keeps_predicated_instructions():
    text = ("\tcode for sm_80\n\t\tFunction : _Z1kv\n"
            "        /*0010*/              @!P0 LDG.E.128 R4, [R2.64] ;   /* 0x0000000402047981 */\n"
            "        /*0020*/               @P1 STS.128 [R3], R4 ;         /* 0x0000000403007388 */\n"
            "        /*0030*/                   EXIT ;                     /* 0x000000000000794d */\n")
    (function,) = kernel_profile.parse_sass(text)
    assert function["arch"] == "sm_80" and function["instructions"] == ["LDG.E.128", "STS.128", "EXIT"]


def test_demangle_falls_back_to_the_mangled_name(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(kernel_profile, "find_tool", lambda name: None)
    assert kernel_profile.demangle(["_Z1kv"]) == {"_Z1kv": "_Z1kv"}


# ---------------------------------------------------------------- a machine without the tools
def _course(*args, path: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=path, CUDA_HOME="/nonexistent", PYTHONPATH=CLI_PATH)
    return subprocess.run([sys.executable, CLI, *args], capture_output=True, text=True, env=env, timeout=300)


def test_missing_ncu_says_where_it_comes_from(tmp_path, monkeypatch):
    monkeypatch.setattr(kernel_profile, "_TOOL_FOLDERS", ())
    monkeypatch.setenv("PATH", str(tmp_path))
    assert kernel_profile.find_tool("ncu") is None
    result = _course("profile", "00", path=str(tmp_path) + os.pathsep + os.path.dirname(sys.executable))
    if "/usr/local/cuda/bin/ncu" in result.stdout or os.path.exists("/usr/local/cuda/bin/ncu"):
        pytest.skip("this machine has ncu in /usr/local/cuda/bin, which profile finds off PATH")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs Nsight Compute's command-line profiler `ncu`" in result.stdout
    assert "cuda-nsight-compute" in result.stdout and "export PATH=" in result.stdout


def test_missing_cuobjdump_says_where_it_comes_from(tmp_path):
    if any(os.path.exists(f"{folder}/cuobjdump") for folder in ("/usr/local/cuda/bin",)):
        pytest.skip("this machine has cuobjdump in /usr/local/cuda/bin, which profile finds off PATH")
    result = _course("profile", "00", "--sass", path=str(tmp_path) + os.pathsep + os.path.dirname(sys.executable))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "needs `cuobjdump` (and `nvdisasm`" in result.stdout and "pip install nvidia-cuda-cuobjdump" in result.stdout


def test_no_gpu_is_said_before_anything_runs(tmp_path, monkeypatch, capsys):
    ncu = tmp_path / "ncu"
    ncu.write_text("#!/bin/sh\nexit 0\n")
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(kernel_profile.runner, "gpu_visible", lambda: False)
    lab = trees.find_lab("00")
    assert kernel_profile.profile(sys.executable, lab, "solutions") == 2
    assert "needs a CUDA GPU the driver sees" in capsys.readouterr().out


def test_profile_mode_profiles_once_and_skips(monkeypatch):
    """The harness side, without a GPU: with COURSE_PROFILE set a perf case calls its kernels twice (warm, then
    inside the profiler range), records the range and skips; torch.cuda's profiler calls are stubbed."""
    import torch

    calls, events = [], []
    monkeypatch.setenv(perf.PROFILE_ENV, "ours,baseline")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: events.append("marker"))
    monkeypatch.setattr(torch.cuda.profiler, "start", lambda: events.append("start"))
    monkeypatch.setattr(torch.cuda.profiler, "stop", lambda: events.append("stop"))
    monkeypatch.setattr(perf, "PROFILED", [])
    with pytest.raises(pytest.skip.Exception, match="profiled under Nsight Compute"):
        perf.perf_case(lab="00-first-kernel", name="scale", ours=lambda: calls.append("ours"),
                       baseline=lambda: calls.append("baseline"), baseline_name="torch.mul", student_bar=0.5,
                       target=0.8, is_reference=True, verify=lambda: None)
    assert calls == ["ours", "ours", "baseline", "baseline"]
    assert events == ["start", "marker", "stop", "start", "marker", "stop"]
    assert perf.PROFILED == [{"case": "scale", "side": "ours", "baseline_name": "torch.mul"},
                             {"case": "scale", "side": "baseline", "baseline_name": "torch.mul"}]
    assert perf.RESULTS == [] or all(r["name"] != "scale" for r in perf.RESULTS)


def test_the_reference_fails_when_the_sites_bars_are_not_the_graders(monkeypatch, tmp_path):
    """The bench file the site renders (measured on this GPU) must carry the bars the grader holds the reference
    to: a target changed in a test without a new `./course bench --json` fails the reference, naming the command.
    Students are not held to it, and neither is the bench run that rewrites the file."""
    bench = {"gpu": "NVIDIA H100 80GB HBM3", "cases": [{"name": "scale", "target": 0.8, "student_bar": 0.5}]}
    (tmp_path / "00-first-kernel.json").write_text(json.dumps(bench))
    monkeypatch.setattr(perf.trees, "BENCH_DATA", tmp_path)
    monkeypatch.setattr(perf.trees, "ROOT", tmp_path)
    monkeypatch.delenv(perf.BENCH_WRITING_ENV, raising=False)
    case = perf.PerfCase("00-first-kernel", "scale", "torch.mul", 1.0, 1.0, 0.5, 0.8, 0, 0)
    perf.check_committed_bars(case, "NVIDIA H100 80GB HBM3")  # the same bars
    perf.check_committed_bars(perf.PerfCase("00-first-kernel", "scale", "torch.mul", 1.0, 1.0, 0.5, 0.95, 0, 0),
                              "NVIDIA H200")  # measured on another GPU: its bars may differ
    stale = perf.PerfCase("00-first-kernel", "scale", "torch.mul", 1.0, 1.0, 0.5, 0.95, 0, 0)
    with pytest.raises(GradeFailure, match=r"says target 0.8, student bar 0.5; this grader uses target 0.95.*"
                                           r"\n  rerun `./course bench 00 --impl solutions --json`"):
        perf.check_committed_bars(stale, "NVIDIA H100 80GB HBM3")
    monkeypatch.setenv(perf.BENCH_WRITING_ENV, "1")
    perf.check_committed_bars(stale, "NVIDIA H100 80GB HBM3")


# ---------------------------------------------------------------- the real run
@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
@pytest.mark.parametrize("lab, kernel", [("00", "scale_kernel"), ("01", "copy_vectorized_kernel"),
                                         ("02", "tiled_transpose_kernel"), ("03", "partial_sums_kernel"),
                                         ("04", "sgemm_warptiling"), ("05", "linear_act_kernel")])
def test_profile_runs_on_the_gpu(lab, kernel, tmp_path):
    """One kernel per lab under ncu, parsed and checked: on the GPU box (ncu on PATH, permission to read the
    counters) the next session runs

        .venv/bin/python -m pytest tests/test_course_profile.py -q -k gpu    # or: ./course test (tooling tests)
        ./course profile 01 --impl solutions --json site/data/profile/01-memory-bandwidth.json

    and reads the tables against the lesson's claims."""
    if not kernel_profile.find_tool("ncu"):
        pytest.skip(kernel_profile.missing_ncu())
    out = tmp_path / "profile.json"
    select = {"04": ["-k", "k7"], "05": ["-k", "vs_cublas_gemm"]}.get(lab, [])
    run = subprocess.run([COURSE, "profile", lab, "--impl", "solutions", "--kernel", kernel, *select,
                          "--json", str(out)], capture_output=True, text=True, timeout=1800)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    data = json.loads(out.read_text())
    (first, *_) = [k for k in data["kernels"] if kernel in k["kernel"]]
    assert first["case"], "the kernel lost its perf case: the range markers and the harness's list disagree"
    assert first["time_us"] > 0 and first["registers"] > 0 and first["limiter"]
    assert first["achieved_occupancy_pct"] and first["top_stalls"]
    if lab in ("00", "01"):
        assert first["dram_pct"] > 50 and first["load_sectors_per_request"] >= 4
    if lab == "05":
        assert first["tensor_pipe_pct"] > 10


STAND_IN_NCU = '''#!{python}
"""A stand-in for ncu: runs the application with ncu's options stripped, then writes the recorded report."""
import shutil, subprocess, sys
args, options, i = sys.argv[1:], {{}}, 0
while args[i].startswith("--"):
    if args[i] == "--csv":
        i += 1
        continue
    options[args[i]] = args[i + 1]
    i += 2
with open("{calls}", "a") as log:
    log.write(" ".join(sys.argv[1:i]) + "\\n")
code = subprocess.run(args[i:]).returncode
shutil.copy("{report}", options["--log-file"])
sys.exit(code)
'''
STAND_IN_SMI = '''#!/bin/sh
case "$1" in
  -L) echo "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000000)" ;;
  *) echo "NVIDIA H100 80GB HBM3, 9.0" ;;
esac
'''


def test_profile_pipeline_with_a_stand_in_ncu(tmp_path):
    """The whole `./course profile` path on CPU: the lab is built, its perf tests run under the wrapper with
    ncu's options, the report ncu would write is parsed and printed, and --json is written. The stand-ins for
    ncu and nvidia-smi only pretend; the perf tests skip (no GPU), so no range is recorded and the kernels come
    without their case."""
    calls = tmp_path / "ncu-calls.txt"
    for name, text in (("ncu", STAND_IN_NCU.format(python=sys.executable, calls=calls,
                                                   report=DATA / "ncu-raw-report.csv")),
                       ("nvidia-smi", STAND_IN_SMI)):
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    out = tmp_path / "profile.json"
    env = dict(os.environ, PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}", PYTHONPATH=CLI_PATH)
    run = subprocess.run([sys.executable, CLI, "profile", "00", "--impl", "solutions", "-k", "scale", "--json",
                          str(out)], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    options = calls.read_text().split()
    assert options[:3] == ["--profile-from-start", "off", "--csv"]
    assert "smsp__average_warps_issue_stalled_gmma_per_issue_active.ratio" in options[options.index("--metrics") + 1]
    assert "-- copy_vectorized_kernel" in run.stdout and "How to read them" in run.stdout
    data = json.loads(out.read_text())
    assert data["gpu"] == "NVIDIA H100 80GB HBM3" and data["command"] == "./course profile 00 --impl solutions -k scale"
    assert len(data["kernels"]) == 5 and all(k["case"] is None for k in data["kernels"])


# ---------------------------------------------------------------- the site's profile tables (site/hooks/profiles.py)
def _load_profiles_hook():
    """site/hooks/profiles.py as mkdocs loads it, by file path (the hooks are no package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("course_profiles_hook", trees.SITE_SOURCES / "hooks" / "profiles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hook(kernels, tmp_path, monkeypatch):
    """The hook reading a folder that holds one profile JSON as `./course profile 02 --json` writes it, made from the
    hand-written ncu report (not invented data under site/data/profile: that folder holds only what a GPU measured)."""
    module = _load_profiles_hook()
    data = {"lab": "02-shared-memory", "impl": "solutions", "gpu": "NVIDIA H100 80GB HBM3", "cc": "9.0",
            "ncu": "2025.3.1.0", "date": "2026-11-27", "clock_control": "base (ncu's default)",
            "command": "./course profile 02 --impl solutions -k tiled",
            "kernels": kernel_profile.merge_repeats([kernel_profile.summarize(k) for k in kernels])}
    (tmp_path / "02-shared-memory.json").write_text(json.dumps(data))
    monkeypatch.setattr(module, "DATA", tmp_path)
    return module


class _Page:
    class file:  # noqa: N801 (mkdocs's Page.file.src_uri)
        src_uri = "02-shared-memory.md"


def test_profile_marker_becomes_a_table_of_the_matching_kernel(hook, caplog):
    text = hook.on_page_markdown("Before.\n\n<!-- profile: 02-shared-memory tiled_transpose_kernel<32> -->\n\nAfter.\n",
                                 _Page, {}, None)
    print(text)
    assert text.startswith("Before.\n") and text.rstrip().endswith("After.") and "<!--" not in text
    assert '<div class="profile">' in text
    assert "<th><code>tiled_transpose_kernel&lt;32&gt;</code><br>tiled transpose 8192x8192 fp32 vs copy</th>" in text
    assert "copy_vectorized_kernel" not in text  # only the kernels the pattern names
    assert ('<tr><td>shared bank conflicts, loads</td><td align="right">65011712 (96.9% of wavefronts)</td></tr>'
            in text)
    assert '<tr><td>top warp stalls (share of cycles per issue)</td><td align="right">mio throttle' in text
    assert ("<em>Nsight Compute 2025.3.1.0 on NVIDIA H100 80GB HBM3, 2026-11-27, by <code>./course profile 02 "
            "--impl solutions -k tiled</code>") in text
    assert not caplog.records


def test_profile_table_has_a_column_per_launch(hook):
    # partial_sums_kernel, final_sum_kernel, and torch.sum's baseline kernel (whose full name has sum_functor)
    table = hook.render("02-shared-memory", "sum", False, "x.md")
    header = table.splitlines()[2]
    assert header.count("<br>") == 3 and header.endswith("sum 2^28 fp32 (baseline torch.sum)</th></tr></thead>")
    assert all(line.count("<td") == 4 for line in table.splitlines() if line.startswith("<tr><td>")), table
    assert "tensor pipe" not in table


def test_profile_pending_marker_without_data_is_a_box(hook, caplog):
    box = hook.render("00-first-kernel", "scale_kernel", True, "00-first-kernel.md")
    assert 'class="admonition note profile-pending"' in box and "Not measured yet" in box
    assert "<code>./course profile 00 --impl solutions --kernel &#x27;scale_kernel&#x27; --json</code>" in box
    assert "site/data/profile/00-first-kernel.json" in box
    assert not caplog.records


def test_profile_pending_marker_with_data_fails_the_strict_build(hook, caplog):
    table = hook.render("02-shared-memory", "tiled_transpose", True, "02-shared-memory.md")
    assert "profile-pending" not in table and "<th>metric</th>" in table
    assert any("should no longer say pending" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")


def test_profile_marker_without_data_or_match_fails_the_strict_build(hook, caplog):
    assert "No profile of 00-first-kernel" in hook.render("00-first-kernel", "scale_kernel", False, "00.md")
    assert "No profiled kernel matches" in hook.render("02-shared-memory", "no_such_kernel", False, "02.md")
    assert "Bad kernel pattern" in hook.render("02-shared-memory", "(", False, "02.md")
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 3, warnings
    assert "commit site/data/profile/00-first-kernel.json" in warnings[0]
    assert "copy_vectorized_kernel, final_sum_kernel" in warnings[1]


def test_profile_hook_is_registered_after_bench():
    hooks = re.findall(r"^\s*-\s*(site/hooks/\S+)", (trees.ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert "site/hooks/profiles.py" in hooks and hooks.index("site/hooks/profiles.py") > hooks.index(
        "site/hooks/bench.py")


def test_profile_markers_on_the_lessons_name_their_lab():
    """Each marker names its own page's lab (the JSON is per lab) and a kernel pattern that compiles."""
    hook_module = _load_profiles_hook()
    found = 0
    for page in sorted(trees.LESSONS.glob("[0-9][0-9]-*.md")):
        for match in hook_module.MARKER.finditer(page.read_text()):
            found += 1
            assert match.group(1) == page.stem, f"{page.name}: a profile marker names {match.group(1)}"
            re.compile(match.group(2))
    assert found >= 6


@pytest.mark.parametrize("unit, micros", [("ns", 1.5), ("nsecond", 1.5), ("us", 1500.0), ("usecond", 1500.0),
                                          ("ms", 1.5e6)])
def test_time_units_as_ncu_writes_them(unit, micros):
    """Nsight Compute 2025.3 with --print-units base writes the duration's unit as "ns" (seen on an H100): read as
    microseconds it made every kernel 1000x slower on the pages and its DRAM GB/s 1000x lower."""
    kernel = {"metrics": {"gpu__time_duration.sum": 1500.0}, "units": {"gpu__time_duration.sum": unit}}
    assert kernel_profile._scaled(kernel, "gpu__time_duration.sum", kernel_profile._TIME_SCALE) == pytest.approx(micros)
