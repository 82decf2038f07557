"""Lesson 09, section 1: how many Python functions one call of the same `2 * x` runs, by how it is bound.

    ./course run site/data/evidence/09-custom-ops/python_calls.py [--out FOLDER]   (CPU only: no GPU needed)

Builds two tiny CPU extensions with torch.utils.cpp_extension.load_inline: a pybind11 function `twice` and a
TORCH_LIBRARY op `course_calls::twice` (+ `twice_plain`, with no autograd kernel), registers a fake and an autograd
formula from Python the way lab 09's ops.py does, and counts the Python "call" events of one call
(sys.setprofile, the notebook's section 9 method). Also: torch._dynamo.explain of f(x) = twice(sin(x)) + 1 with
each binding (graphs and breaks). Row names: "op" is the TORCH_LIBRARY op, "custom_op" a
torch.library.custom_op whose body calls the pybind11 function; "inference_mode" rows run under
torch.inference_mode(), the others with grad mode on and inputs that do not require grad. Writes python_calls.json
and dynamo_explain.json (default: beside this file).
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
import tempfile
from pathlib import Path

import torch
from torch.utils.cpp_extension import load_inline

HERE = Path(__file__).resolve().parent

PYBIND_SRC = """
#include <torch/extension.h>
at::Tensor twice(const at::Tensor& x) { return x * 2; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
OP_SRC = """
#include <torch/library.h>
#include <ATen/ATen.h>
at::Tensor twice(const at::Tensor& x) { return x * 2; }
TORCH_LIBRARY(course_calls, m) {
  m.def("twice(Tensor x) -> Tensor");
  m.def("twice_plain(Tensor x) -> Tensor");
}
TORCH_LIBRARY_IMPL(course_calls, CPU, m) {
  m.impl("twice", &twice);
  m.impl("twice_plain", &twice);
}
"""


def python_calls(fn, *args) -> list[str]:
    fn(*args)  # warm: first-call caches
    calls: list[str] = []
    sys.setprofile(lambda frame, event, arg: calls.append(frame.f_code.co_name) if event == "call" else None)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE, help="folder for python_calls.json and dynamo_explain.json")
    args = parser.parse_args()
    build = Path(tempfile.mkdtemp(prefix="lesson09_calls_"))
    pyb = load_inline("calls_pyb", cpp_sources=[PYBIND_SRC], build_directory=str(build), verbose=False)
    (build / "op").mkdir()
    load_inline("calls_op", cpp_sources=[OP_SRC], build_directory=str(build / "op"), is_python_module=False,
                verbose=False)
    ops = torch.ops.course_calls
    for name in ("twice", "twice_plain"):
        torch.library.register_fake(f"course_calls::{name}")(lambda x: torch.empty_like(x))
    torch.library.register_autograd("course_calls::twice", lambda ctx, g: 2 * g,
                                    setup_context=lambda ctx, inputs, output: None)

    @torch.library.custom_op("course_calls_py::twice", mutates_args=())
    def twice_custom(x: torch.Tensor) -> torch.Tensor:
        return pyb.twice(x)

    twice_custom.register_fake(lambda x: torch.empty_like(x))
    x = torch.randn(4)
    rows = []

    def row(name, binding, fn, mode="grad mode"):
        if mode == "inference_mode":
            with torch.inference_mode():
                calls = python_calls(fn, x)
        else:
            calls = python_calls(fn, x)
        rows.append({"name": name, "binding": binding, "mode": mode, "python_calls": len(calls),
                     "functions": ", ".join(f"`{c}`" for c in calls)})
        print(f"{name:<45} {len(calls):3d}  {calls}")

    row("pybind11 function", "a pybind11 function", pyb.twice)
    row("op, no autograd kernel", "a `TORCH_LIBRARY` op, no autograd kernel", ops.twice_plain)
    row("op + register_autograd", "a `TORCH_LIBRARY` op + `register_autograd`", ops.twice)
    row("op + register_autograd, inference_mode", "a `TORCH_LIBRARY` op + `register_autograd`", ops.twice,
        "inference_mode")
    row("custom_op around pybind11", "`torch.library.custom_op` calling the pybind11 function", twice_custom)
    row("custom_op around pybind11, inference_mode", "`torch.library.custom_op` calling the pybind11 function",
        twice_custom, "inference_mode")

    explained = []
    for name, fn in (("pybind11 function", pyb.twice), ("op with a fake", ops.twice)):
        torch._dynamo.reset()
        e = torch._dynamo.explain(lambda t, fn=fn: fn(torch.sin(t)) + 1)(x)
        explained.append({"name": name, "graph_count": e.graph_count,
                          "graph_break_count": e.graph_break_count})
        print(explained[-1])

    common = {
        "gpu": "the course's CPU machine (no GPU)",
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "date": datetime.date.today().isoformat(),
        "command": "python3 site/data/evidence/09-custom-ops/python_calls.py",
        "source": "this script's output, run on the course's CPU machine",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    tables = {"python_calls": {"columns": [["binding", "the same 2 * x as", ""], ["mode", "mode", ""],
                                           ["python_calls", "Python calls", "d"],
                                           ["functions", "the Python functions, in order", ""]]}}
    for name, data in (("python_calls", rows), ("dynamo_explain", explained)):
        path = args.out / f"{name}.json"
        table = {"table": tables[name]} if name in tables else {}
        path.write_text(json.dumps({**common, "rows": data, **table}, indent=1) + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
