"""Timing against the PyTorch baseline in the same process, the same run.

Method: CUDA events around each call, warm-up first, the L2 flushed before
every timed call (so a small input is not served from cache), ours and the
baseline interleaved (so clock drift hits both), the median of many runs.
"""
from __future__ import annotations

import json
import os
import random
import time
import zlib
from dataclasses import asdict, dataclass, field
from typing import Callable

import pytest
import torch

from coursekit import jit, trees

from . import calls
from .check import GradeFailure

# Every perf case measured in this process; conftest writes them out for `./course bench`.
RESULTS: list[dict] = []
_ceilings: dict[str, float] = {}
# `./course profile` (tools/course/profile.py) runs the perf tests under Nsight Compute with this variable set
# ("ours", or "ours,baseline"): each perf case then runs its calls once untimed and once between
# cudaProfilerStart and cudaProfilerStop, the range `ncu --profile-from-start off` profiles, and its test
# skips. No timing: ncu replays each kernel many times at locked clocks. The perf cases are the profile cases.
PROFILE_ENV = "COURSE_PROFILE"
# One entry per profiled range, in order: the case's name and which side ran in it. conftest writes them out.
PROFILED: list[dict] = []
# The kernel launched first in each profiled range (torch.cuda._sleep's `spin_kernel`): in ncu's report it
# marks where one range's kernels end and the next range's begin. tools/course/profile.py splits on it.
RANGE_MARKER_KERNEL = "spin_kernel"


# A kernel this many times slower than its baseline fails every bar of the course by far: a few timed calls say
# so as surely as `reps` do. (A grid of one block took 10 s of a class run's GPU alone, 25 reps of two cases at
# about 80 ms a call, while every other perf run waited; lab 00, H100.)
# Both conditions: against a baseline that does almost nothing every ratio is large, never a call this long.
FAR_TOO_SLOW = 20.0
FAR_TOO_SLOW_MS = 5.0
FAR_TOO_SLOW_REPS = 3


def time_pair(ours: Callable, baseline: Callable, warmup: int = 3, reps: int = 25, flush_l2: bool = True,
              before_rep: Callable | None = None):
    """Median milliseconds of `ours` and of `baseline`, timed alternately (jit.py holds the timer
    that the notebooks use too); FAR_TOO_SLOW_REPS reps where a first pair says ours is far too slow.
    `before_rep` runs untimed before each round (rotate_inputs: new input values for every call)."""
    with calls.unchecked():  # the per-call checks copy every input: never inside a timing
        ours_ms, baseline_ms = jit.interleaved_median_ms((ours, baseline), warmup=1, reps=1, flush_l2=flush_l2,
                                                         before_rep=before_rep)
        if ours_ms > FAR_TOO_SLOW * baseline_ms and ours_ms > FAR_TOO_SLOW_MS:
            reps, warmup = min(reps, FAR_TOO_SLOW_REPS), 0
        ours_ms, baseline_ms = jit.interleaved_median_ms((ours, baseline), warmup=warmup, reps=reps,
                                                         flush_l2=flush_l2, before_rep=before_rep)
    return ours_ms, baseline_ms


# ---------------------------------------------------------------- timings that cannot be gamed
# Three ways a submission can look fast without being fast, each seen on 2026's public kernel leaderboards:
# returning an earlier call's result (cache-and-replay), leaving the work on another stream so that the events on
# the current stream time nothing, and skipping work. The answers: every timed call gets new input values
# (rotate_inputs) and the output of the last timed call is checked against them (perf_case's verify); a time under
# the physical floor (the bytes at FLOOR_MARGIN x the measured copy bandwidth, the FLOPs at FLOOR_MARGIN x a
# measured fp16 matmul) is refused; and after a call, the device must be idle once the current stream is
# (work_left_behind_ms).
FLOOR_MARGIN = 1.3  # the measured ceilings are 85-90% of the datasheet's; no kernel beats the datasheet
LEFTOVER_MS = 0.1  # device work still running this long after the current stream finished: another stream's
LEFTOVER_TRIES = 3  # the least of three: one late host wake-up must not fail an honest kernel


def rotate_inputs(inputs, seed: int) -> Callable | None:
    """A function that gives each tensor of `inputs` new values in place: its elements rolled by a fresh random
    offset (the same values, so the same distribution and any invariant of the set of values, at other places).
    Tensors whose elements share memory (expanded views) and single elements are left as they are. None when no
    tensor can be rotated."""
    tensors = [t for t in inputs if isinstance(t, torch.Tensor) and t.numel() > 1
               and not (0 in t.stride() and t.dim() > 0)]
    if not tensors:
        return None
    offsets = random.Random(seed)

    def rotate():
        with torch.no_grad():
            for tensor in tensors:
                tensor.copy_(tensor.roll(offsets.randrange(1, tensor.numel())))

    return rotate


def matmul_tflops() -> float:
    """The measured ceiling for matrix-bound kernels: an fp16 matrix product (8192 x 8192 x 4096) through cuBLAS, in
    TFLOP/s; fp16 is the tensor cores' fastest type that every GPU of the course has (T4 to H200)."""
    if "matmul" not in _ceilings:
        a = torch.randn(8192, 4096, device="cuda", dtype=torch.float16)
        b = torch.randn(4096, 8192, device="cuda", dtype=torch.float16)
        ms = jit.interleaved_median_ms([lambda: a @ b], warmup=3, reps=10, flush_l2=False)[0]
        _ceilings["matmul"] = 2 * 8192 * 8192 * 4096 / (ms * 1e-3) / 1e12
        del a, b
    return _ceilings["matmul"]


def physical_floor_ms(bytes_moved: int, flops: int) -> float:
    """The least time the work can take on this GPU: its bytes at FLOOR_MARGIN x the copy ceiling, its FLOPs at
    FLOOR_MARGIN x the matmul ceiling (the larger of the two; 0 when the case counts neither)."""
    floors = [0.0]
    if bytes_moved:
        floors.append(bytes_moved / (FLOOR_MARGIN * copy_bandwidth() * 1e9) * 1e3)
    if flops:
        floors.append(flops / (FLOOR_MARGIN * matmul_tflops() * 1e12) * 1e3)
    return max(floors)


def work_left_behind_ms(fn: Callable, tries: int = LEFTOVER_TRIES) -> float:
    """Milliseconds the device stays busy after fn()'s work on the current stream has finished: the least of
    `tries` calls. An op that launches its work on the current stream (or on streams the current one waits for)
    leaves nothing; one that leaves its kernel on another stream leaves that kernel's time."""
    leftovers = []
    with calls.unchecked():
        for _ in range(tries):
            torch.cuda.synchronize()
            fn()
            torch.cuda.current_stream().synchronize()
            current_done = time.perf_counter()
            torch.cuda.synchronize()
            leftovers.append((time.perf_counter() - current_done) * 1e3)
    return min(leftovers)


def check_integrity(case: "PerfCase", ours: Callable, floor_ms: float) -> None:
    """Refuse a timing no honest kernel gives: under the physical floor, or with work left on another stream."""
    if case.ours_ms < floor_ms:
        raise GradeFailure(
            f"{case.summary()}\n  impossibly fast: {case.ours_ms:.4f} ms is under this work's physical floor of "
            f"{floor_ms:.4f} ms on this GPU (its bytes and FLOPs at {FLOOR_MARGIN}x the measured copy and matmul "
            "ceilings). The timed calls must do their work, all of it, on the current stream, every call: no result "
            "kept from an earlier call, no kernel left running on another stream")
    left = work_left_behind_ms(ours)
    if left > LEFTOVER_MS and left > 0.2 * case.ours_ms:
        raise GradeFailure(
            f"{case.summary()}\n  after the op returned and the current stream finished, the GPU was still busy for "
            f"{left:.3f} ms: work left on another stream, which the timing on the current stream does not see (and "
            "which the caller's next kernel would race with). Launch on course::current_stream(), or make the "
            "current stream wait for your stream's event before returning")


# After GPU memory goes back to the driver (torch.cuda.empty_cache: the grader's past-2^31 cases do it, and so does
# torch.cuda.graph before a capture), memory-bound kernels ran 13-17% slower for a while on an H100: lab 07's first
# perf case read 0.213 ms after the past-2^31 cases in the same process and 0.183 ms without them, its copy baseline
# alike; after 48 GiB handed back, a copy ran 16% slower for its first 100 ms (tools/gpu/probe/alloc_speed.py,
# tools/gpu/probe/carveout.py; git show 8a81008:tools/gpu/NOTES.md). A case timed in that window reads its % of copy
# low, and a ratio whose sides are not equally bound by bandwidth moves (lab 07's forward + backward read 1.07x there,
# 1.10x elsewhere). So each case first waits, at most SETTLE_MAX_S, until a copy runs at SETTLE_FRACTION of the
# process's copy ceiling (normally 0.99-1.0 of it, 0.84 in that window).
SETTLE_FRACTION = 0.93
SETTLE_MAX_S = 1.0


def settle(measure_gbps: Callable[[], float], ceiling_gbps: float, clock: Callable[[], float] = time.perf_counter,
           max_s: float = SETTLE_MAX_S) -> tuple[float, float]:
    """Measure until a measurement reaches SETTLE_FRACTION of the ceiling or max_s have passed; (seconds waited,
    the last measurement in GB/s)."""
    start = clock()
    while True:
        gbps = measure_gbps()
        waited = clock() - start
        if gbps >= SETTLE_FRACTION * ceiling_gbps or waited >= max_s:
            return waited, gbps


def settle_gpu() -> tuple[float, float]:
    """settle() with the ceiling's own copy (1 GiB, the median of 5), on this GPU; (0, 0) without waiting where the
    case's own tensors leave no room for the copy's 2 GiB (a small GPU): timed unsettled, as before."""
    ceiling = copy_bandwidth()  # first: its own 2 GiB are freed before these are taken
    try:
        src = torch.empty(_COPY_FLOATS, device="cuda")
        dst = torch.empty_like(src)
    except torch.cuda.OutOfMemoryError:
        return 0.0, 0.0
    return settle(lambda: _copy_gbps(src, dst, warmup=1, reps=5), ceiling)


class CaptureFailed(Exception):
    """A CUDA graph capture that failed; its cause is the launch's error or capture_end's report."""


def capture(run: Callable, *, warmups: int = 1):
    """(graph, what run() returned inside it): run() warmed `warmups` times on a side stream first (lazy
    initialisation must not happen inside a capture, and torch.cuda.graph asks for the side stream), then captured
    once. A failed capture raises CaptureFailed from its error, after a synchronize; a failed warm-up raises its own."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmups):
            run()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            outputs = run()
    except Exception as error:  # noqa: BLE001 (the launch error, or capture_end's report of it)
        torch.cuda.synchronize()
        raise CaptureFailed(str(error)) from error
    return graph, outputs


def as_graph(fn: Callable) -> Callable | None:
    """fn captured once in a CUDA graph (capture, two warm-ups), returned as the graph's replay: a replay launches
    all of fn's kernels with no CPU work between them. None where the capture fails (a call that waits for the CPU,
    such as .item(), or launches off the current stream)."""
    try:
        graph, _ = capture(fn, warmups=2)
    except CaptureFailed:  # the caller times the calls instead
        return None
    return graph.replay  # the bound method keeps the graph alive


_COPY_FLOATS = 2**28  # the ceiling's copy: 1 GiB of float32


def _copy_gbps(src: torch.Tensor, dst: torch.Tensor, *, warmup: int, reps: int) -> float:
    """dst.copy_(src) in GB/s (bytes read plus bytes written): the median of `reps` timed copies, L2 not flushed."""
    ms = jit.interleaved_median_ms([lambda: dst.copy_(src)], warmup=warmup, reps=reps, flush_l2=False)[0]
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


def copy_bandwidth() -> float:
    """The measured ceiling for memory-bound kernels: a 1 GiB device-to-device copy, in GB/s
    (bytes read plus bytes written)."""
    if "copy" not in _ceilings:
        src = torch.randn(_COPY_FLOATS, device="cuda")
        dst = torch.empty_like(src)
        # The best of three, 0.1 s apart: measured once, in a slow window after memory went back to the driver (see
        # SETTLE_FRACTION), the ceiling itself read low, and settle() then accepted a copy at 2587 GB/s, 86% of the
        # usual 3005 (H100, 2026-11-27).
        rates = []
        for attempt in range(3):
            if attempt:
                time.sleep(0.1)
            rates.append(_copy_gbps(src, dst, warmup=3, reps=20))
        _ceilings["copy"] = max(rates)
        del src, dst
    return _ceilings["copy"]


def target_on_this_gpu(target: float, by_gpu: dict[str, float]) -> float:
    """A reference target, or the one `by_gpu` sets for this GPU (a key found in its name, e.g. "H200"): for a case
    whose reference was measured under the common target on that GPU, the figure measured there, with the reason
    beside the grader's table."""
    name = torch.cuda.get_device_name() if torch.cuda.is_available() else ""
    return next((value for key, value in by_gpu.items() if key in name), target)


@dataclass
class PerfCase:
    lab: str
    name: str
    baseline_name: str
    ours_ms: float
    baseline_ms: float
    student_bar: float
    target: float
    bytes: int = 0
    flops: int = 0
    ratio: float = field(init=False)
    ours_gbps: float = field(init=False)
    pct_of_copy: float | None = None
    ours_tflops: float = field(init=False)

    def __post_init__(self):
        self.ratio = self.baseline_ms / self.ours_ms
        self.ours_gbps = self.bytes / (self.ours_ms * 1e-3) / 1e9 if self.bytes else 0.0
        self.ours_tflops = self.flops / (self.ours_ms * 1e-3) / 1e12 if self.flops else 0.0

    def summary(self) -> str:
        text = (f"{self.name}: {self.ratio:.2f}x {self.baseline_name} "
                f"({self.ours_ms:.3f} ms vs {self.baseline_ms:.3f} ms)")
        if self.bytes:
            text += f", {self.ours_gbps:.0f} GB/s"
            if self.pct_of_copy is not None:
                text += f" = {self.pct_of_copy:.0f}% of copy bandwidth"
        if self.flops:
            text += f", {self.ours_tflops:.1f} TFLOP/s"
        return text


def perf_case(
    *,
    lab: str,
    name: str,
    ours: Callable,
    baseline: Callable,
    baseline_name: str,
    student_bar: float,
    target: float,
    is_reference: bool,
    bytes_moved: int = 0,
    flops: int = 0,
    verify: Callable[[], None],
    inputs=(),
    refresh: Callable[[], None] | None = None,
    reps: int = 25,
    graphs: bool = False,
) -> PerfCase:
    """Time ours against the baseline and hold it to the bar.

    The bar is the reference target when grading the solutions and the student
    bar otherwise. `inputs` are the tensors ours and the baseline read: before every timed call they get new
    values in place (rotate_inputs), so no call can return an earlier call's result; `refresh`, if given, does that
    instead (an op whose result a rotation leaves unchanged, a sum over every element, draws new values). `verify`
    runs after timing on
    what the last timed call produced, against the inputs as they are then, so a kernel that is fast because it
    skips work or replays a result fails here too; so does a time under the physical floor, or work left on
    another stream (check_integrity).
    Under `./course profile` (PROFILE_ENV set) the case is profiled instead, and its test skips.
    graphs=True times each side as a CUDA graph of one call (as_graph), for a side whose CPU time a call can exceed
    its GPU time: the timer's events then measure the CPU (lab 07's torch.compile'd forward + backward, lesson 07's
    notes). A side that cannot be captured is timed as calls, and the summary says so.
    """
    if os.environ.get(PROFILE_ENV):
        profile_case(name, ours, baseline, baseline_name, sides=os.environ[PROFILE_ENV].split(","))
    simulated = jit.simulated_arch()
    if simulated:  # the older GPU's code on this one: its output is checked, its speed says nothing
        ours()
        torch.cuda.synchronize()
        verify()
        pytest.skip(f"{name}: output checked, speed not graded: compute capability {simulated} simulated "
                    f"(COURSE_TARGET_ARCH) on a {torch.cuda.get_device_name()}")
    if graphs:
        replays = [as_graph(ours), as_graph(baseline)]
        uncaptured = [side for side, replay in zip(("ours", "the baseline"), replays) if replay is None]
        ours, baseline = (replay or fn for replay, fn in zip(replays, (ours, baseline)))
        baseline_name += (f"; {' and '.join(uncaptured)} not capturable in a CUDA graph, timed as calls" if uncaptured
                          else "; each side replayed as a CUDA graph")
    floor_ms = physical_floor_ms(bytes_moved, flops)  # before settling: its matmul is heavy work of its own
    settled_s, settled_gbps = settle_gpu()
    rotate = refresh or rotate_inputs(inputs, seed=trees.seed() ^ zlib.crc32(name.encode()))
    ours_ms, baseline_ms = time_pair(ours, baseline, reps=reps, before_rep=rotate)
    case = PerfCase(lab, name, baseline_name, ours_ms, baseline_ms, student_bar, target, bytes_moved, flops)
    if bytes_moved:
        case.pct_of_copy = 100.0 * case.ours_gbps / copy_bandwidth()
    record = asdict(case)
    record["gpu"] = torch.cuda.get_device_name()
    record["settle"] = {"waited_s": round(settled_s, 3), "copy_gbps": round(settled_gbps, 1)}
    record["floor_ms"], record["inputs_rotated"] = round(floor_ms, 5), rotate is not None
    RESULTS.append(record)
    verify()  # the last timed call's output, against the inputs it was given
    check_integrity(case, ours, floor_ms)
    record["verified"] = True  # correct and honestly timed: the ratio may rank (report.speed_score)
    if is_reference:
        check_committed_bars(case, record["gpu"])
    bar = target if is_reference else student_bar
    who = "reference target" if is_reference else "student bar"
    print(case.summary())
    if case.ratio < bar:
        raise GradeFailure(
            f"{case.summary()}\n  below the {who} of {bar:.2f}x "
            f"(student bar {student_bar:.2f}x, reference target {target:.2f}x)"
        )
    return case


BENCH_WRITING_ENV = "COURSE_BENCH_WRITING"  # set by `./course bench`: the run that rewrites the committed bars


def check_committed_bars(case: PerfCase, gpu: str) -> None:
    """The bars the site shows (site/data/bench/NN-slug.json, measured on this GPU) are the ones this grader holds
    the reference to: a target changed in a test without a new bench run fails the reference here, so the page's
    table cannot go stale."""
    path = trees.BENCH_DATA / f"{case.lab}.json"
    if os.environ.get(BENCH_WRITING_ENV) or not path.is_file():
        return
    data = json.loads(path.read_text())
    committed = next((c for c in data.get("cases", []) if c.get("name") == case.name), None)
    if data.get("gpu") != gpu or committed is None:
        return
    if (committed.get("target"), committed.get("student_bar")) != (case.target, case.student_bar):
        raise GradeFailure(
            f"{case.name}: {path.relative_to(trees.ROOT)} (the site's table, measured on this GPU) says target "
            f"{committed.get('target')}, student bar {committed.get('student_bar')}; this grader uses target "
            f"{case.target}, student bar {case.student_bar}\n  rerun `./course bench {case.lab[:2]} --impl solutions "
            "--json` on this GPU and commit the file")


def profile_case(name: str, ours: Callable, baseline: Callable, baseline_name: str, *, sides: list[str]) -> None:
    """Run each side ("ours", "baseline") once to warm it (lazy initialization, cuBLAS handles, the caching
    allocator), then once inside a profiler range that opens with the marker kernel; record the range and
    skip the test. Without the profiler attached, cudaProfilerStart and Stop do nothing."""
    calls_of = {"ours": ours, "baseline": baseline}
    with calls.unchecked():
        for side in ("ours", "baseline"):
            if side not in sides:
                continue
            fn = calls_of[side]
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            torch.cuda._sleep(1)  # RANGE_MARKER_KERNEL: this range's first kernel in ncu's report
            fn()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()
            PROFILED.append({"case": name, "side": side, "baseline_name": baseline_name})
    pytest.skip(f"{name}: profiled under Nsight Compute ({' and '.join(s for s in sides if s in calls_of)}); "
                "not timed")
