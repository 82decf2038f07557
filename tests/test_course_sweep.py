"""The shape sweeps of `./course bench NN --sweep` (tests/harness/sweep.py, tests/graderNN/sweep.py,
tools/course/sweep_cmd.py), checked without a GPU: the shape tables, the JSON and its plot on fake timings, a peer
that cannot be used recorded with its reason, and the CLI's flag. The timings themselves need the GPU box."""
from __future__ import annotations

import importlib
import importlib.util
import json
import sys

import pytest
import torch

from coursekit import trees
from harness import sweep

pytest.register_assert_rewrite("grader06", "grader07")  # as their entry modules do, whichever imports them first
SWEEP_LABS = ["06", "07"]


def _ops(number: str) -> list[sweep.Op]:
    return sweep.table_of(number).sweep_ops()


def _load_plots_hook():
    """site/hooks/plots.py as mkdocs loads it, by file path (the hooks are no package)."""
    spec = importlib.util.spec_from_file_location("course_plots_hook", trees.SITE_SOURCES / "hooks" / "plots.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- the shape tables
@pytest.mark.parametrize("number", SWEEP_LABS)
def test_every_shape_has_its_bytes_and_none_comes_twice(number):
    seen = set()
    for op in _ops(number):
        assert op.shapes, f"{op.name} {op.dtype}: no shapes"
        assert op.shapes == sorted(op.shapes, key=lambda s: (op.bytes_moved(*s), s))
        for rows, hidden in op.shapes:
            moved = op.bytes_moved(rows, hidden)
            assert isinstance(moved, int) and moved >= 2 * rows * hidden * sweep.element_size(op.dtype), \
                (op.name, rows, hidden, moved)
            key = (op.name, op.dtype, rows, hidden)
            assert key not in seen, f"{key} twice"
            seen.add(key)


@pytest.mark.parametrize("number", SWEEP_LABS)
def test_the_shapes_span_the_sizes_and_the_odd_counts_models_have(number):
    ops = _ops(number)
    for op in ops:
        sizes = [op.bytes_moved(*s) for s in op.shapes]
        assert min(sizes) <= 2 * sweep.MiB, f"{op.name}: smallest {min(sizes)} bytes"
        assert 512 * sweep.MiB <= max(sizes) <= 1.6 * sweep.GiB, f"{op.name}: largest {max(sizes)} bytes"
        inside = [b for b in sizes if sweep.LOW_BYTES <= b <= sweep.HIGH_BYTES]
        assert 12 <= len(inside) and len(op.shapes) <= 30, (op.name, len(inside), len(op.shapes))
        rows = {r for r, _ in op.shapes}
        hidden = {h for _, h in op.shapes}
        assert any(r <= 7 for r in rows), f"{op.name}: no decode-sized row count in {sorted(rows)}"
        assert any(r > 1000 and r % 2 for r in rows), f"{op.name}: no large odd row count in {sorted(rows)}"
        model_rows = {r for r, h in op.shapes if h in sweep.MODEL_HIDDEN}  # vocabulary shapes: 4096 x 50257 too
        assert all(r % 8 for r in model_rows if r > 1), f"{op.name}: a row count that is a multiple of 8"
        assert hidden & {5003, 12291}, f"{op.name}: no odd hidden size in {sorted(hidden)}"
        if op.name in ("bias_gelu_fwd", "rms_norm_fwd", "softmax_fwd"):
            assert 20 <= len(op.shapes) <= 30, (op.name, len(op.shapes))
    everywhere = {s for op in ops for s in op.shapes}
    assert set(sweep.MODEL_ROWS) <= {r for r, _ in everywhere} | {1}
    assert set(sweep.MODEL_HIDDEN) <= {h for _, h in everywhere}


def test_the_labs_sweep_the_ops_their_graders_time():
    lab06 = {(op.name, op.dtype) for op in _ops("06")}
    assert lab06 == {("bias_gelu_fwd", torch.bfloat16), ("bias_gelu_fwd", torch.float32),
                     ("bias_gelu_fwd_bwd", torch.bfloat16), ("bias_gelu_fwd_bwd", torch.float32)}
    lab07 = {op.name: op for op in _ops("07")}
    assert set(lab07) == {"rms_norm_fwd", "rms_norm_bwd", "softmax_fwd"}
    assert lab07["rms_norm_fwd"].dtype == torch.bfloat16 and lab07["softmax_fwd"].dtype == torch.float32
    assert "ours_triton" in {i.name for i in lab07["rms_norm_fwd"].impls}
    assert set(sweep.VOCAB) <= {h for _, h in lab07["softmax_fwd"].shapes}
    for op in _ops("06") + _ops("07"):  # every peer is there: measured, or recorded with why not
        names = [impl.name for impl in op.impls]
        assert {"ours", "eager", "compiled", "liger", "quack"} <= set(names) and len(names) == len(set(names))
        assert all(impl.make or impl.unsupported for impl in op.impls)
        assert all(impl.verify for impl in op.impls if impl.name.startswith("ours"))


def test_pick_shapes_spreads_over_log2_bytes_and_keeps_the_named_ones():
    def size(rows, hidden):
        return 4 * rows * hidden

    picked = sweep.pick_shapes(size, 10, always=[(1, 4096)])
    assert picked == sweep.pick_shapes(size, 10, always=[(1, 4096)])  # deterministic
    assert len(picked) == 11 and (1, 4096) in picked and len(set(picked)) == 11
    inside = [s for s in picked if sweep.LOW_BYTES <= size(*s) <= sweep.HIGH_BYTES]
    everything = [(r, h) for r in sweep.MODEL_ROWS for h in sweep.MODEL_HIDDEN
                  if sweep.LOW_BYTES <= size(r, h) <= sweep.HIGH_BYTES]
    assert min(map(lambda s: size(*s), inside)) == min(map(lambda s: size(*s), everything))
    assert max(map(lambda s: size(*s), inside)) == max(map(lambda s: size(*s), everything))


# ---------------------------------------------------------------- the JSON and its plot, on fake timings
def _fake_op(name, dtype, shapes, *, peers=True) -> sweep.Op:
    def ours(t):
        return lambda: (t["x"] * 2,)

    def wrong_at_five(t, outputs):
        if t["x"].shape[0] == 5:
            raise AssertionError("y at (0, 0): got 1, expected 2\n  hint: ...")

    def refuses_odd(t):
        if t["x"].shape[1] % 2:
            raise sweep.Unsupported("quack: odd hidden sizes are not taken")
        return lambda: (t["x"] * 2,)

    impls = [sweep.Impl("ours", ours, verify=wrong_at_five), sweep.Impl("eager", lambda t: lambda: (t["x"] + t["x"],)),
             sweep.Impl("compiled", lambda t: lambda: (t["x"] * 2.0,))]
    if peers:
        impls += [sweep.Impl("liger", ours, peer="liger"), sweep.Impl("quack", refuses_odd)]
    return sweep.Op(name, dtype, shapes, lambda r, h: 2 * r * h * 4 * 2**10,
                    lambda r, h: {"x": torch.ones(r, h, dtype=dtype)}, impls)


def _fake_run(monkeypatch, ops, budget_s=float("inf")) -> sweep.Run:
    monkeypatch.setitem(sweep.PEERS, "liger", sweep.Peer("liger", "no-such-distribution-x9", "no_such_module_x9"))
    speeds = {"ours": 1.0, "eager": 2.0, "compiled": 1.25, "quack": 0.8}
    order: list[list[str]] = []

    def fake_time(fns):  # the calls come in the order prepare() made them: eager first
        names = [name for name in sweep.IMPLS if name in speeds][:len(fns)]
        order.append(names)
        return [speeds[n] for n in names]

    monkeypatch.setattr(sweep, "time_calls", fake_time)
    run = sweep.Run("99-fake", copy_gbps=1000.0, budget_s=budget_s)
    for op in ops:
        sweep.run_op(run, op)
    return run


def test_the_json_has_every_field_and_the_plot_draws_it(monkeypatch, tmp_path):
    ops = [_fake_op("fake_fwd", torch.float32, [(5, 64), (7, 128)]),
           _fake_op("fake_fwd", torch.bfloat16, [(7, 129)])]
    run = _fake_run(monkeypatch, ops)
    facts = {"gpu": "Fake GPU", "torch": "2.x", "cuda": "13.0"}
    data = sweep.document(run, facts, title="fake", command="./course bench 99 --sweep --json", complete=True)
    out = tmp_path / "99-fake-sweep.json"
    sweep.write(out, data)
    data = json.loads(out.read_text())
    for key in ("lab", "gpu", "device", "torch", "cuda", "date", "command", "copy_bandwidth_gbps", "peers", "rows",
                "plot", "skipped", "complete"):
        assert key in data, key
    assert data["complete"] and data["copy_bandwidth_gbps"] == 1000.0
    rows = {(tuple(r["shape"]), r["dtype"], r["impl"]): r for r in data["rows"]}
    ours = rows[(5, 64), "float32", "ours"]
    for key in ("op", "dtype", "shape", "rows", "hidden", "bytes", "impl", "ms", "gbps", "pct_of_copy", "vs_compiled"):
        assert key in ours, key
    assert ours["bytes"] == 2 * 5 * 64 * 4 * 1024 and ours["ms"] == 1.0
    assert ours["gbps"] == round(ours["bytes"] / 1e-3 / 1e9, 1)
    assert ours["pct_of_copy"] == round(100 * ours["bytes"] / 1e-3 / 1e9 / 1000.0, 1)
    assert ours["vs_compiled"] == 1.25 and rows[(5, 64), "float32", "eager"]["vs_compiled"] == 0.625
    assert ours["verified"] is False and "got 1, expected 2" in ours["verify_error"]
    assert rows[(7, 128), "float32", "ours"]["verified"] is True
    assert rows[(7, 128), "float32", "quack"]["err_vs_eager"] == 0.0 and "verified" not in rows[(7, 128), "float32",
                                                                                                   "eager"]
    assert ((7, 129), "bfloat16", "quack") not in rows  # refused: in skipped, with its reason
    assert {"op": "fake_fwd", "dtype": "bfloat16", "shape": [7, 129], "impl": "quack",
            "reason": "quack: odd hidden sizes are not taken"} in data["skipped"]
    spec = data["plot"]
    assert (spec["x"], spec["y"], spec["series"], spec["panels"], spec["log2_x"]) == \
        ("bytes", "pct_of_copy", "impl", ["op", "dtype"], True)
    svg = _load_plots_hook().svg_plot(data)
    assert svg.startswith("<svg") and "op fake_fwd, dtype float32" in svg and "op fake_fwd, dtype bfloat16" in svg
    assert "MiB" in svg and "Fake GPU" in svg
    assert svg.count("<polyline") == 4 + 3  # float32: eager, ours, compiled, quack; bfloat16: quack refused


def test_a_peer_that_cannot_be_used_is_recorded_with_its_reason(monkeypatch):
    run = _fake_run(monkeypatch, [_fake_op("fake_fwd", torch.float32, [(7, 128)])])
    assert run.peers()["liger"] == "no_such_module_x9 not installed (pip install no-such-distribution-x9)"
    entry = next(s for s in run.skipped if s["impl"] == "liger")
    assert entry["shape"] is None and "not installed" in entry["reason"]
    assert not [r for r in run.rows if r["impl"] == "liger"]
    module, version = sweep.peer_status(sweep.Peer("torch", "torch", "torch"))
    assert module is torch and version == importlib.metadata.version("torch")
    module, reason = sweep.peer_status(sweep.Peer("broken", "pytest", "no_such_module_x9"))
    assert module is None and reason.startswith("pytest ") and "does not import: ModuleNotFoundError" in reason


def test_a_sweep_past_its_budget_records_the_shapes_it_left(monkeypatch):
    run = _fake_run(monkeypatch, [_fake_op("fake_fwd", torch.float32, [(5, 64), (7, 128)], peers=False)],
                    budget_s=-1.0)
    assert not run.rows
    assert [s["shape"] for s in run.skipped] == [[5, 64], [7, 128]]
    assert all(s["impl"] == "all" and "time budget" in s["reason"] for s in run.skipped)


def test_a_failing_implementation_or_timing_costs_its_shape_not_the_sweep(monkeypatch):
    def broken(t):
        raise RuntimeError("Triton: out of resources\n  required: 300000")

    op = _fake_op("fake_fwd", torch.float32, [(5, 64), (7, 128)], peers=False)
    op.impls += [sweep.Impl("liger", broken), sweep.Impl("quack", lambda t: lambda: (t["x"] * float("nan"),))]
    run = _fake_run(monkeypatch, [op])
    assert {"op": "fake_fwd", "dtype": "float32", "shape": [5, 64], "impl": "liger",
            "reason": "RuntimeError: Triton: out of resources"} in run.skipped
    assert [r["err_vs_eager"] for r in run.rows if r["impl"] == "quack"] == [None, None]  # NaN is no number in JSON

    def failing_timer(fns):
        raise RuntimeError("CUDA error: an illegal instruction was encountered")

    monkeypatch.setattr(sweep, "time_calls", failing_timer)
    run = sweep.Run("99-fake", copy_gbps=1000.0)
    sweep.run_op(run, _fake_op("fake_fwd", torch.float32, [(5, 64), (7, 128)], peers=False))
    assert not run.rows and not run.aborted
    assert [s["shape"] for s in run.skipped if s["impl"] == "all"] == [[5, 64], [7, 128]]
    assert all("timing failed: RuntimeError: CUDA error" in s["reason"] for s in run.skipped)


def test_select_cuts_and_refuses_unknown_ops():
    ops = _ops("07")
    chosen = sweep.select(ops, "softmax_fwd", 3)
    assert [op.name for op in chosen] == ["softmax_fwd"] and len(chosen[0].shapes) == 3
    with pytest.raises(SystemExit, match="no op nope in this lab's sweep; its ops: rms_norm_bwd"):
        sweep.select(_ops("07"), "nope", None)


# ---------------------------------------------------------------- the CLI
def _cli(monkeypatch, tmp_path):
    import cli

    monkeypatch.setattr(cli.env, "python_for", lambda group, *a: sys.executable)
    monkeypatch.setattr(cli.trees, "LOGS", tmp_path / "logs")  # the child's JSON: not into the checkout's build/
    return cli


def test_bench_sweep_runs_the_child_and_writes_the_plot_data(monkeypatch, tmp_path, capsys):
    cli = _cli(monkeypatch, tmp_path)
    seen = {}

    def fake_child(python, trees_, lab, impl, out, *, deadline_s, ops, command, runner):
        seen.update(lab=lab.number, impl=impl, deadline=deadline_s, ops=ops, command=command)
        run = sweep.Run("06-fused-elementwise", copy_gbps=1000.0)
        run.rows.append({"op": "bias_gelu_fwd", "dtype": "bfloat16", "shape": [7, 8192], "rows": 7, "hidden": 8192,
                         "bytes": 2**20, "impl": "ours", "ms": 0.01, "gbps": 104.9, "pct_of_copy": 10.5,
                         "vs_compiled": 1.1, "verified": True})
        facts = {"gpu": "Fake GPU", "torch": "2.x", "cuda": "13.0"}
        sweep.write(out, sweep.document(run, facts, title="t", command=command, complete=True))
        return 0, False

    monkeypatch.setattr(cli.sweep_cmd, "run_child", fake_child)
    target = tmp_path / "sweep.json"
    assert cli.main(["bench", "06", "--impl", "solutions", "--sweep", "--json", str(target), "--ops",
                     "bias_gelu_fwd", "--deadline", "300"]) == 0
    assert seen == {"lab": "06", "impl": "solutions", "deadline": 300, "ops": "bias_gelu_fwd",
                    "command": f"./course bench 06 --impl solutions --sweep --json {target}"}
    data = json.loads(target.read_text())
    assert data["rows"][0]["impl"] == "ours" and data["command"] == seen["command"]
    printed = capsys.readouterr().out
    assert "bias_gelu_fwd" in printed and "1/1" in printed and "Fake GPU" in printed
    # plain --json: the site's plot data, the file `<!-- plot: 06-fused-elementwise-sweep -->` draws
    lab = trees.find_lab("06")
    assert cli.sweep_cmd.default_output(trees, lab) == trees.PLOT_DATA / "06-fused-elementwise-sweep.json"
    # --json -: the JSON alone on stdout
    assert cli.main(["bench", "06", "--impl", "solutions", "--sweep", "--json", "-"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["op"] == "bias_gelu_fwd"


def test_bench_sweep_refuses_a_lab_without_a_sweep_table(monkeypatch, tmp_path, capsys):
    cli = _cli(monkeypatch, tmp_path)
    monkeypatch.setattr(cli.sweep_cmd, "run_child", lambda *a, **k: pytest.fail("no child for lab 05"))
    assert cli.main(["bench", "05", "--sweep"]) == 2
    printed = capsys.readouterr().out
    assert "lab 05-tensor-cores has no sweep table (tests/grader05/sweep.py)" in printed
    assert "the labs with one: 06, 07" in printed
    assert cli.main(["bench", "06", "--ops", "bias_gelu_fwd"]) == 2
    assert "add --sweep" in capsys.readouterr().out


def test_bench_sweep_writes_no_plot_data_when_nothing_was_measured(monkeypatch, tmp_path, capsys):
    """An empty "rows" would break the plot hook: the sweep's own log keeps the reasons, the site gets nothing."""
    cli = _cli(monkeypatch, tmp_path)

    def empty_child(python, trees_, lab, impl, out, **kw):
        run = sweep.Run("06-fused-elementwise", copy_gbps=1000.0)
        run.skipped.append({"op": "bias_gelu_fwd", "dtype": "bfloat16", "shape": None, "impl": "all", "reason": "x"})
        sweep.write(out, sweep.document(run, {"gpu": "Fake GPU"}, title="t", command="c", complete=False))
        return 1, False

    monkeypatch.setattr(cli.sweep_cmd, "run_child", empty_child)
    target = tmp_path / "sweep.json"
    assert cli.main(["bench", "06", "--sweep", "--json", str(target)]) == 1
    assert not target.exists() and "nothing was measured" in capsys.readouterr().out
