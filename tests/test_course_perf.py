"""Timings that cannot be gamed (harness.perf), on CPU with the clock and the measurements faked: a perf case waits for
the copy rate to settle before it times, its inputs get new values in place before every timed call, a time under the
physical floor or with work left on the device fails the case, and a kernel far too slow against its baseline is
timed only a few times instead of the reps asked for."""
from __future__ import annotations

import pytest


def test_perf_cases_wait_for_the_copy_rate_before_timing():
    """perf.settle, which each perf case runs before it times: measurements until one reaches SETTLE_FRACTION of the
    copy ceiling, or until max_s; with the seconds waited and the last reading."""
    from harness import perf

    def clock_from(times):
        ticks = iter(times)
        return lambda: next(ticks)

    readings = iter([2500.0, 2550.0, 2990.0])  # 0.83, 0.85, then 0.997 of a 3000 GB/s ceiling
    waited, gbps = perf.settle(lambda: next(readings), 3000.0, clock=clock_from([0.0, 0.1, 0.2, 0.3]))
    assert (waited, gbps) == (0.3, 2990.0)
    calls = []
    waited, gbps = perf.settle(lambda: calls.append(1) or 2000.0, 3000.0, clock=clock_from([0.0, 0.4, 0.8, 1.2]),
                               max_s=1.0)
    assert (waited, gbps, len(calls)) == (1.2, 2000.0, 3)  # gave up after max_s, timed anyway
    waited, gbps = perf.settle(lambda: 2900.0, 3000.0, clock=clock_from([5.0, 5.002]))
    assert gbps == 2900.0 and abs(waited - 0.002) < 1e-9  # the usual case: one measurement
    assert 0.85 < perf.SETTLE_FRACTION < 0.99


def test_rotated_inputs_get_new_values_in_place_with_the_same_values():
    """perf.rotate_inputs, run before every timed call: each tensor keeps its storage (what a cache keyed on the
    pointer sees) and its set of values, at other places; an expanded view (shared elements) is left alone."""
    import torch

    from harness import perf

    x, w = torch.randn(1000), torch.randn(7, 13).t()  # a contiguous tensor and a strided one
    bias = torch.randn(1).expand(50)
    before = [t.clone() for t in (x, w, bias)]
    pointers = [t.data_ptr() for t in (x, w, bias)]
    rotate = perf.rotate_inputs((x, w, bias, 3.0), seed=1)
    for _ in range(3):
        rotate()
        assert not torch.equal(x, before[0]) and not torch.equal(w, before[1]), "a rotation left an input as it was"
        assert torch.equal(x.sort().values, before[0].sort().values), "a rotation changed the set of values"
        assert torch.equal(w.flatten().sort().values, before[1].flatten().sort().values)
    assert [t.data_ptr() for t in (x, w, bias)] == pointers and torch.equal(bias, before[2])
    assert perf.rotate_inputs((bias, torch.ones(1)), seed=1) is None


def test_a_time_under_the_physical_floor_or_with_work_left_behind_fails(monkeypatch):
    """perf.check_integrity: a time under the floor (the bytes at FLOOR_MARGIN x the copy ceiling, the FLOPs at
    FLOOR_MARGIN x the matmul ceiling) is refused as impossibly fast; so is a device still busy after the current
    stream finished (work left on another stream); an honest time passes."""
    from harness import perf

    monkeypatch.setitem(perf._ceilings, "copy", 4000.0)  # GB/s
    monkeypatch.setitem(perf._ceilings, "matmul", 800.0)  # TFLOP/s
    floor = perf.physical_floor_ms(bytes_moved=2 * 2**30, flops=0)
    assert abs(floor - 2 * 2**30 / (perf.FLOOR_MARGIN * 4000e9) * 1e3) < 1e-9
    assert perf.physical_floor_ms(0, 2 * 4096**3) == pytest.approx(2 * 4096**3 / (perf.FLOOR_MARGIN * 800e12) * 1e3)
    assert perf.physical_floor_ms(0, 0) == 0.0

    def case(ours_ms):
        return perf.PerfCase("00-first-kernel", "scale", "torch.mul", ours_ms, 0.5, 0.5, 0.8, bytes=2 * 2**30)

    leftover = {"ms": 0.01}
    monkeypatch.setattr(perf, "work_left_behind_ms", lambda fn: leftover["ms"])
    perf.check_integrity(case(0.6), lambda: None, floor)  # honest: over the floor, nothing left behind
    with pytest.raises(perf.GradeFailure, match="impossibly fast"):
        perf.check_integrity(case(0.004), lambda: None, floor)
    leftover["ms"] = 0.5
    with pytest.raises(perf.GradeFailure, match="still busy"):
        perf.check_integrity(case(0.6), lambda: None, floor)


@pytest.mark.parametrize("first, reps", [((100.0, 1.0), 3), ((3.0, 0.1), 25), ((10.0, 1.0), 25)])
def test_a_far_too_slow_kernel_is_timed_a_few_times(monkeypatch, first, reps):
    """perf.time_pair times a first pair; a kernel FAR_TOO_SLOW x its baseline and over FAR_TOO_SLOW_MS a call gets
    FAR_TOO_SLOW_REPS reps, anything else (a baseline that does nothing included) the reps asked for."""
    from harness import perf

    asked = []

    def fake(fns, *, warmup, reps, flush_l2, before_rep=None):
        asked.append(reps)
        return list(first)

    monkeypatch.setattr(perf.jit, "interleaved_median_ms", fake)
    assert perf.time_pair(lambda: None, lambda: None) == first
    assert asked == [1, reps]
