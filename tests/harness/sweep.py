"""Shape sweeps: a lab's memory-bound ops over the shapes real models have, against PyTorch and peer libraries.

`./course bench NN --sweep` (tools/course/sweep_cmd.py) runs `python -m harness.sweep NN --out FILE` in the test
python, as bench runs pytest. The lab's table is tests/graderNN/sweep.py: sweep_ops() lists its ops (one Op per op
and dtype), with their shapes, the bytes each moves, and how each implementation is called (ours through the same
entry points as the grader's perf cases: LAB.module, the lab's autograd.py, its Triton op). Per shape:
  1. every implementation is made and called once (torch.compile compiles here, once per shape, dynamic=False, after
     torch._dynamo.reset(); Triton and CuTe kernels JIT-compile). One that is not installed, or refuses the dtype or
     shape, is recorded with its reason under "skipped", never dropped;
  2. ours is checked against the float64 reference with the grader's own checks and tolerances ("verified"), and
     every implementation's outputs are compared with eager PyTorch's ("err_vs_eager", the relative rms difference);
  3. all are timed together: perf.settle_gpu, then jit.interleaved_median_ms (the grader's timer, as perf.time_pair:
     a warm-up, the L2 flushed before every call, CUDA events, the median of REPS calls, the implementations
     interleaved so that clock drift hits all). An op with graphs=True times each call as a CUDA graph replay
     (perf.as_graph), as lab 07's forward + backward perf case does: a side whose CPU time exceeds its GPU time.
Inputs are not rotated between calls: the sweep compares implementations; the grader's perf cases grade ours.
bytes: the op's least traffic (every input read once, every output written once), defined once per op and the same
for every implementation, so GB/s and % of the copy ceiling (perf.copy_bandwidth) are effective rates and
vs_compiled (torch.compile's time / this one's) ranks them alike. The output is site/data/plots/NN-slug-sweep.json,
which site/hooks/plots.py draws (document(): x bytes, y % of copy, a line per implementation, a panel per op and
dtype).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import importlib
import importlib.metadata
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest
import torch

from coursekit import jit, trees

from . import calls, perf
from .check import dtype_name, first_line

MiB, GiB = 2**20, 2**30
# The shapes of real models: row counts that are a multiple of no tile (a decode step's 1 and 7 tokens, a short
# prompt's 255, prefill batches of 999 to 16387 tokens) and the hidden sizes of today's models (2048 to 14336:
# Llama's 4096, 5120, 8192, 11008, 14336) with two odd ones (5003, 12291: no vector width divides them). Vocabulary
# rows for softmax (Llama 2's 32000, GPT-2's 50257, Llama 3's 128256, and an odd 100003).
MODEL_ROWS = (1, 7, 255, 999, 2999, 4097, 16387)
MODEL_HIDDEN = (2048, 4096, 5003, 5120, 8192, 11008, 12291, 14336)
VOCAB = (32000, 50257, 100003, 128256)
# pick_shapes keeps the shapes whose bytes fall in this window (~1 MiB to ~1 GiB; up to 1.25 GiB so that
# 16387 x 8192 float32 stays in), spread over log2(bytes); the decode and vocabulary shapes a table names come on top.
LOW_BYTES, HIGH_BYTES = MiB, GiB + GiB // 4
WARMUP, REPS = 3, 25
# The implementations, in the order they are made (eager first: its outputs are what the others are compared
# with) and in which the plot's legend lists them.
IMPLS = ("eager", "ours", "ours_triton", "compiled", "liger", "quack")


class Unsupported(Exception):
    """Raised by an implementation's make() for a dtype or shape it does not take; the message is the reason."""


@dataclass(frozen=True)
class Peer:
    name: str  # the "impl" of its rows
    distribution: str  # on PyPI
    module: str  # what is imported


PEERS = {"liger": Peer("liger", "liger-kernel", "liger_kernel"), "quack": Peer("quack", "quack-kernels", "quack")}


def peer_status(peer: Peer) -> tuple[object | None, str]:
    """(the imported module, its version), or (None, why it cannot be used)."""
    try:
        version = importlib.metadata.version(peer.distribution)
    except importlib.metadata.PackageNotFoundError:
        return None, f"{peer.module} not installed (pip install {peer.distribution})"
    try:
        module = importlib.import_module(peer.module)
    except Exception as error:  # noqa: BLE001 (a missing dependency, a GPU it does not support: the reason)
        return None, f"{peer.distribution} {version} does not import: {type(error).__name__}: {first_line(error)}"
    return module, version


def installed_version(peer: Peer) -> str:
    """The peer's version without importing it, or why it is not there."""
    try:
        return importlib.metadata.version(peer.distribution)
    except importlib.metadata.PackageNotFoundError:
        return f"{peer.module} not installed (pip install {peer.distribution})"


@dataclass
class Impl:
    """One implementation of an op. make(inputs) returns the call to time; the call returns a tuple whose first
    Op.outputs entries are the op's results. verify(inputs, outputs) (ours) raises where the grader's checks fail.
    unsupported: why this implementation does not do the op at all. peer: the PEERS entry it needs."""
    name: str
    make: Callable[[dict], Callable[[], tuple]] | None = None
    verify: Callable[[dict, tuple], None] | None = None
    peer: str | None = None
    unsupported: str | None = None


@dataclass
class Op:
    """One op in one dtype over its shapes ((rows, hidden) pairs)."""
    name: str
    dtype: torch.dtype
    shapes: list[tuple[int, int]]
    bytes_moved: Callable[[int, int], int]  # (rows, hidden) -> the op's least traffic in bytes
    inputs: Callable[[int, int], dict]  # (rows, hidden) -> the tensors every implementation reads
    impls: list[Impl]
    outputs: int = 1  # leading outputs every implementation returns, compared with eager's
    graphs: bool = False  # each call timed as a CUDA graph replay (perf.as_graph)


# ---------------------------------------------------------------- shape tables
def pick_shapes(bytes_of: Callable[[int, int], int], count: int, *, rows=MODEL_ROWS, hidden=MODEL_HIDDEN,
                always=(), low: float = LOW_BYTES, high: float = HIGH_BYTES) -> list[tuple[int, int]]:
    """`count` of the (rows, hidden) pairs whose bytes_of lies in [low, high], spread over log2(bytes): the smallest
    and the largest, then each time the pair farthest (in log2 bytes) from those taken (ties: a row count, then a
    hidden size, not yet taken), then the `always` pairs (decode steps, vocabulary rows: kept whatever their size);
    sorted by bytes, no pair twice."""
    inside = sorted(((r, h) for r in rows for h in hidden if low <= bytes_of(r, h) <= high),
                    key=lambda s: (bytes_of(*s), s))
    logs = {s: math.log2(bytes_of(*s)) for s in inside}
    chosen = inside[:1] + inside[-1:] if len(inside) > count else list(inside)
    while len(chosen) < min(count, len(inside)):
        def score(s):
            gap = min(abs(logs[s] - logs[c]) for c in chosen)
            return (round(gap, 6), s[0] not in {c[0] for c in chosen}, s[1] not in {c[1] for c in chosen}, s)
        chosen.append(max((s for s in inside if s not in chosen), key=score))
    extra = [s for s in always if s not in chosen]
    return sorted(dict.fromkeys([*chosen, *extra]), key=lambda s: (bytes_of(*s), s))


def element_size(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


# ---------------------------------------------------------------- what the GPU does (tests replace these)
def device_facts() -> dict:
    return {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "cuda": torch.version.cuda}


def copy_ceiling() -> float:
    return perf.copy_bandwidth()


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def time_calls(fns: list[Callable]) -> list[float]:
    """Median milliseconds of each call, timed together (the grader's timer: see the module's docstring)."""
    perf.settle_gpu()
    with calls.unchecked():  # LAB.module's per-call checks copy every input: never inside a timing
        return jit.interleaved_median_ms(fns, warmup=WARMUP, reps=REPS, flush_l2=True)


def as_graph(fn: Callable) -> Callable | None:
    with calls.unchecked():
        return perf.as_graph(fn)


def compile_fresh(fn: Callable) -> Callable:
    """torch.compile(fn, dynamic=False) with dynamo's caches emptied first: one compile for this shape alone, never
    a recompile past dynamo's cache limit (which falls back to eager without a word)."""
    torch._dynamo.reset()
    return torch.compile(fn, dynamic=False)


def relative_error(outputs: tuple, reference: tuple) -> float:
    """The largest relative rms difference between each output and the reference's (float32 arithmetic); NaN where
    one is NaN."""
    errors = []
    for out, ref in zip(outputs, reference):
        ref32 = ref.detach().float()
        diff = torch.linalg.vector_norm(out.detach().float() - ref32).item()
        scale = torch.linalg.vector_norm(ref32).item()
        errors.append(diff / scale if scale else diff)
    return float("nan") if any(math.isnan(e) for e in errors) else max(errors, default=0.0)


# ---------------------------------------------------------------- one sweep
@dataclass
class Run:
    """A sweep under way: the lab, the copy ceiling, the peers, the time budget and what was measured so far."""
    lab: str
    copy_gbps: float
    budget_s: float = float("inf")
    seed: int | None = None  # the inputs' (torch.manual_seed), from COURSE_SEED or drawn once
    started: float = field(default_factory=time.monotonic)
    rows: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    seconds: dict = field(default_factory=dict)
    aborted: str | None = None
    _peers: dict = field(default_factory=dict)

    def out_of_time(self) -> bool:
        return time.monotonic() - self.started > self.budget_s

    def peer(self, name: str) -> tuple[object | None, str]:
        if name not in self._peers:
            self._peers[name] = peer_status(PEERS[name])
        return self._peers[name]

    def peers(self) -> dict[str, str]:
        """Every peer's version, or why it could not be used (a peer no op needed: its installed version)."""
        return {name: self._peers[name][1] if name in self._peers else installed_version(peer)
                for name, peer in PEERS.items()}

    def unavailable(self, impl: Impl) -> str | None:
        if impl.unsupported:
            return impl.unsupported
        return self.peer(impl.peer)[1] if impl.peer and self.peer(impl.peer)[0] is None else None

    def skip(self, op: Op, shape, impl: str, reason: str) -> None:
        self.skipped.append({"op": op.name, "dtype": dtype_name(op.dtype), "shape": list(shape) if shape else None,
                             "impl": impl, "reason": reason})


def _ordered(impls: list[Impl]) -> list[Impl]:
    return sorted(impls, key=lambda impl: IMPLS.index(impl.name) if impl.name in IMPLS else len(IMPLS))


def _verify(impl: Impl, inputs: dict, outputs: tuple) -> dict:
    try:
        impl.verify(inputs, outputs)
    except Exception as error:  # noqa: BLE001 (GradeFailure, or a check that could not run: not verified)
        return {"verified": False, "verify_error": first_line(error)}
    return {"verified": True}


def prepare(run: Run, op: Op, impls: list[Impl], inputs: dict, shape) -> list[tuple[str, Callable, dict]]:
    """Make and call each implementation once at this shape; (name, call, its row's extra fields) for each that
    ran, the others recorded as skipped with the reason."""
    ready, reference = [], None
    for impl in _ordered(impls):
        try:
            call = impl.make(inputs)
            outputs = call()
            synchronize()
        except Exception as error:  # noqa: BLE001 (a refused dtype or shape, a failed compile: the reason)
            reason = str(error) if isinstance(error, Unsupported) else f"{type(error).__name__}: {first_line(error)}"
            run.skip(op, shape, impl.name, reason)
            _check_context()
            continue
        extra = _verify(impl, inputs, outputs) if impl.verify else {}
        if impl.name == "eager":
            reference = tuple(outputs[:op.outputs])
        elif reference is not None:
            error = relative_error(tuple(outputs[:op.outputs]), reference)
            extra["err_vs_eager"] = float(f"{error:.3g}") if math.isfinite(error) else None  # None: NaN or inf
        del outputs
        ready.append((impl.name, call, extra))
    return ready


def _check_context() -> None:
    """A kernel that broke the CUDA context (an illegal address) breaks every later call: stop the sweep there."""
    try:
        synchronize()
    except RuntimeError as error:
        raise ContextBroken(first_line(error)) from None


class ContextBroken(RuntimeError):
    """The CUDA context is unusable: nothing after this can be measured in this process."""


def run_shape(run: Run, op: Op, impls: list[Impl], rows: int, hidden: int) -> None:
    shape = (rows, hidden)
    inputs = op.inputs(rows, hidden)
    ready = prepare(run, op, impls, inputs, shape)
    if not ready:
        return
    fns, timed_as = [], []
    for _, call, _ in ready:
        try:
            replay = as_graph(call) if op.graphs else None
        except Exception:  # noqa: BLE001 (its warm-up failed: timed as calls, where a failure says why)
            replay = None
        fns.append(replay or call)
        timed_as.append("graph" if replay else "calls (not capturable)" if op.graphs else "calls")
    times = dict(zip((name for name, _, _ in ready), time_calls(fns)))
    moved = op.bytes_moved(rows, hidden)
    for (name, _, extra), how in zip(ready, timed_as):
        run.rows.append(row(run, op, shape, moved, name, times[name], times.get("compiled"), how, extra))


def row(run: Run, op: Op, shape, moved: int, impl: str, ms: float, compiled_ms: float | None, timed_as: str,
        extra: dict) -> dict:
    gbps = moved / (ms * 1e-3) / 1e9
    return {"op": op.name, "dtype": dtype_name(op.dtype), "shape": list(shape), "rows": shape[0],
            "hidden": shape[1], "bytes": moved, "impl": impl, "ms": round(ms, 5), "gbps": round(gbps, 1),
            "pct_of_copy": round(100.0 * gbps / run.copy_gbps, 1),
            "vs_compiled": round(compiled_ms / ms, 3) if compiled_ms else None, "timed_as": timed_as, **extra}


def run_op(run: Run, op: Op) -> None:
    """Every shape of one op (one dtype); an implementation that cannot run at all is recorded once."""
    started = time.monotonic()
    usable = []
    for impl in op.impls:
        reason = run.unavailable(impl)
        if reason:
            run.skip(op, None, impl.name, reason)
        else:
            usable.append(impl)
    for rows, hidden in op.shapes:
        if run.aborted or run.out_of_time():
            why = run.aborted or f"the sweep's time budget of {run.budget_s:.0f} s ran out"
            run.skip(op, (rows, hidden), "all", f"not run: {why}")
            continue
        try:
            run_shape(run, op, usable, rows, hidden)
        except torch.cuda.OutOfMemoryError as error:
            run.skip(op, (rows, hidden), "all", f"out of GPU memory: {first_line(error)}")
        except ContextBroken as error:
            run.aborted = f"the CUDA context broke at {op.name} {rows}x{hidden}: {error}"
            run.skip(op, (rows, hidden), "all", run.aborted)
        except Exception as error:  # noqa: BLE001 (a call that failed while timed: this shape, not the sweep)
            run.skip(op, (rows, hidden), "all", f"timing failed: {type(error).__name__}: {first_line(error)}")
            try:
                _check_context()
            except ContextBroken as broken:
                run.aborted = f"the CUDA context broke at {op.name} {rows}x{hidden}: {broken}"
    run.seconds[f"{op.name} {dtype_name(op.dtype)}"] = round(time.monotonic() - started, 1)


# ---------------------------------------------------------------- the JSON
def plot_spec(title: str) -> dict:
    """How site/hooks/plots.py draws the rows: x the bytes moved (log2, labelled as sizes), y the % of the copy
    ceiling, a line per implementation, a panel per op and dtype."""
    return {"x": "bytes", "y": "pct_of_copy", "series": "impl", "panels": ["op", "dtype"], "log2_x": True,
            "x_format": "bytes", "x_label": "bytes moved per call (the op's least traffic)",
            "y_label": "% of copy bandwidth", "title": title,
            "caption": "One point per shape (rows x hidden): the op's least bytes (each input read once, each "
                       "output written once) over each implementation's median time, as a percentage of a "
                       "device-to-device copy's rate on the same GPU; higher is faster."}


def document(run: Run, facts: dict, *, title: str, command: str, complete: bool) -> dict:
    """The sweep's JSON: provenance, the copy ceiling, the peers' versions (or why not), the rows and the skipped
    implementations, and the plot spec."""
    return {"lab": run.lab, "gpu": facts.get("gpu"), "device": facts.get("gpu"), "torch": facts.get("torch"),
            "cuda": facts.get("cuda"), "date": _dt.date.today().isoformat(), "command": command,
            "impl": trees.resolve_tree().tag, "seed": run.seed, "copy_bandwidth_gbps": round(run.copy_gbps, 1),
            "peers": run.peers(), "complete": complete and not run.aborted, "aborted": run.aborted,
            "seconds": dict(run.seconds), "reps": REPS, "rows": list(run.rows), "skipped": list(run.skipped),
            "plot": plot_spec(title)}


def write(path: Path, data: dict) -> None:
    """Written whole, then renamed: a sweep killed mid-write leaves the previous op's file, not half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(data, indent=1) + "\n")
    partial.replace(path)


# ---------------------------------------------------------------- python -m harness.sweep
def select(ops: list[Op], names: str | None, max_shapes: int | None) -> list[Op]:
    """The ops named (comma-separated op names; all when None), each cut to its first max_shapes shapes."""
    wanted = [n.strip() for n in names.split(",")] if names else None
    known = sorted({op.name for op in ops})
    unknown = [n for n in wanted or () if n not in known]
    if unknown:
        raise SystemExit(f"harness.sweep: no op {', '.join(unknown)} in this lab's sweep; its ops: {', '.join(known)}")
    chosen = [op for op in ops if wanted is None or op.name in wanted]
    if max_shapes:
        for op in chosen:
            op.shapes = op.shapes[:max_shapes]
    return chosen


def table_of(number: str):
    """The lab's sweep table, tests/graderNN/sweep.py (imported as the graders import their parts)."""
    return importlib.import_module(f"grader{number}.sweep")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.sweep", description=__doc__.splitlines()[0])
    parser.add_argument("lab")
    parser.add_argument("--out", required=True, help="the JSON to write (rewritten after each op)")
    parser.add_argument("--ops", help="only these ops (comma-separated names)")
    parser.add_argument("--max-shapes", type=int, help="only the first N shapes of each op (a smoke run)")
    parser.add_argument("--budget-s", type=float, default=480.0,
                        help="start no shape after this many seconds; the rest are recorded as not run")
    parser.add_argument("--command", default="", help="the command recorded in the JSON")
    args = parser.parse_args(argv)
    lab = trees.find_lab(args.lab)
    if not torch.cuda.is_available():
        print(f"harness.sweep: lab {lab.name}'s sweep needs a CUDA GPU; this machine has none")
        return 2
    table = table_of(lab.number)
    try:
        table.prepare()  # the lab built (and imported) before any shape: a failed build is no sweep at all
    except (Exception, pytest.skip.Exception) as error:  # noqa: BLE001 (a build the machine failed skips)
        print(f"harness.sweep: lab {lab.name} ({trees.resolve_tree().path}) cannot run: {error}")
        return 1
    ops = select(table.sweep_ops(), args.ops, args.max_shapes)
    facts = device_facts()
    run = Run(lab.name, copy_ceiling(), budget_s=args.budget_s, seed=trees.seed())
    torch.manual_seed(run.seed)
    out = Path(args.out)
    for op in ops:
        print(f"[sweep] {op.name} {dtype_name(op.dtype)}: {len(op.shapes)} shapes ...", flush=True)
        run_op(run, op)
        write(out, document(run, facts, title=table.TITLE, command=args.command, complete=False))
    write(out, document(run, facts, title=table.TITLE, command=args.command, complete=True))
    print(f"[sweep] {len(run.rows)} rows, {len(run.skipped)} skipped, {time.monotonic() - run.started:.0f} s: {out}")
    return 0 if not run.aborted else 1


if __name__ == "__main__":
    from harness import sweep as _module  # run as the package's module, not as a second copy named __main__

    sys.exit(_module.main())
