"""The grader under stress: broken, crashing and hanging submissions, a whole class at
once, and `./course doctor` facing each failure it knows how to explain."""
from __future__ import annotations

import csv
import hashlib
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from harness import HAS_GPU, NO_GPU_REASON, mutants, trees

sys.path.insert(0, str(trees.ROOT / "tools" / "course"))
import doctor  # noqa: E402
import env as course_env  # noqa: E402

COURSE = str(trees.ROOT / "course")
LAB = trees.find_lab("00")


def planted(root: Path, student: str, source_tree: str = "solutions", edits: dict | None = None) -> Path:
    """A submission folder: lab 00 copied from a tree, with text edits planted in its files."""
    return mutants.plant(LAB, root / student, [(name, old, new) for name, (old, new) in (edits or {}).items()],
                         source=source_tree)


def tree_digest(folder: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            digest.update(str(path.relative_to(folder)).encode() + path.read_bytes())
    return digest.hexdigest()


def grade_all(submissions: Path, out: Path, *extra: str) -> tuple[dict, list[dict], str]:
    run = subprocess.run([COURSE, "grade", "00", "--all", "--impl", str(submissions), "--json", str(out), *extra],
                         capture_output=True, text=True, timeout=1800)
    assert out.exists(), f"grade --all wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    with open(out.with_suffix(".csv")) as handle:
        rows = list(csv.DictReader(handle))
    return json.loads(out.read_text()), rows, run.stdout


WILD_WRITE = ("    y[i] = alpha * x[i];", "    y[i + (int64_t{1} << 40)] = alpha * x[i];")
SPIN_FOREVER = ("    y[i] = alpha * x[i];",
                "    for (;;) __nanosleep(1000);  // a side effect the compiler must keep\n    y[i] = alpha * x[i];")
SYNTAX_ERROR = ("#include <algorithm>", "#include <algorithm>\nthis is not C++;")


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """A good (alice), an unfinished (bob: the labs/ skeleton) and an uncompilable (carol) submission
    of lab 00, graded once with --all --format gradescope (three builds: shared by the tests below)."""
    root = tmp_path_factory.mktemp("graded")
    submissions = root / "class"
    planted(submissions, "alice")
    planted(submissions, "bob", source_tree="labs")
    planted(submissions, "carol", edits={"scale.cu": SYNTAX_ERROR})
    before = tree_digest(submissions)
    gradescope_dir = root / "gradescope"
    report, rows, output = grade_all(submissions, root / "grades.json", "--format", "gradescope",
                                     "--out", str(gradescope_dir))
    return {"submissions": submissions, "modified": tree_digest(submissions) != before, "report": report, "rows": rows,
            "output": output, "gradescope": gradescope_dir}


def test_batch_grading_one_row_per_student_and_lab(graded_class):
    """A good, an unfinished and an uncompilable submission: each graded, none modified, none breaking another."""
    report, rows, output = graded_class["report"], graded_class["rows"], graded_class["output"]
    assert not graded_class["modified"], "grading modified a submission"
    assert set(report) == {"alice", "bob", "carol"} and len(rows) == 3
    by_student = {row["student"]: row for row in rows}
    assert by_student["alice"]["failed"] == "0" and int(by_student["alice"]["passed"]) > 0, output
    bob_todos = [todo for test in report["bob"][0]["tests"] for todo in test.get("todos", [])]
    assert int(by_student["bob"]["failed"]) > 0 and any(todo["task"].startswith("lab00.") for todo in bob_todos), (
        "the skeleton's failures must carry the open TODOs they need (the `todos` field)")
    assert int(by_student["carol"]["failed"]) > 0 and "did not build" in by_student["carol"]["errors"]


# ---------------------------------------------------------------- Gradescope
# https://gradescope-autograders.readthedocs.io/en/latest/specs/: the fields ./course writes.
GRADESCOPE_FIELDS = {"score": (int, float), "execution_time": (int, float), "output": str, "tests": list}
GRADESCOPE_TEST_FIELDS = {"name": str, "score": (int, float), "max_score": (int, float), "output": str,
                          "visibility": str, "status": str}
GRADESCOPE_VISIBILITY = {"hidden", "after_due_date", "after_published", "visible"}


def gradescope_results(path: Path, points: dict) -> dict:
    """results.json, checked against Gradescope's schema and against the lab's tasks and POINTS."""
    data = json.loads(path.read_text())
    for key, types in GRADESCOPE_FIELDS.items():
        assert isinstance(data.get(key), types), f"{path}: {key!r} missing or not {types}"
    tasks = {}
    for test in data["tests"]:
        for key, types in GRADESCOPE_TEST_FIELDS.items():
            assert isinstance(test.get(key), types), (
                f"{path}: test {test.get('name')!r}: {key!r} missing or not {types}")
        assert test["visibility"] in GRADESCOPE_VISIBILITY and test["status"] in ("passed", "failed"), test
        assert 0 <= test["score"] <= test["max_score"], test
        tasks[test["name"].split()[1].rstrip(":")] = test
    assert data["score"] == pytest.approx(sum(t["score"] for t in data["tests"]))
    assert set(tasks) >= set(points), f"{path}: one test per task of POINTS expected, got {sorted(tasks)}"
    for task, maximum in points.items():
        assert tasks[task]["max_score"] == maximum, (task, tasks[task]["max_score"], maximum)
    return data


def test_gradescope_results_for_a_good_an_unfinished_and_an_uncompilable_submission(graded_class, tmp_path):
    report = graded_class["report"]
    points = report["alice"][0].get("labs", {}).get(LAB.name, {}).get("points", {})
    results = {student: gradescope_results(graded_class["gradescope"] / student / "results.json", points)
               for student in ("alice", "bob", "carol")}
    carol = results["carol"]
    assert carol["score"] == 0 and all(t["score"] == 0 for t in carol["tests"])
    # nvcc's "f.cu(6): error", g++'s "f.cu:6:1: error"
    compiler_error = re.compile(r"scale\.cu(\(\d+\)|:\d+:\d+): error")
    for text in [carol["output"], *(t["output"] for t in carol["tests"])]:
        assert "did not build" in text and compiler_error.search(text), f"no compiler error in:\n{text[:3000]}"
    alice, bob = results["alice"], results["bob"]
    assert bob["score"] <= alice["score"], (bob["score"], alice["score"])
    # Where a test that ran (on CPU: the launch configuration, axpy's input check) tells them apart, it shows.
    told = any(t["outcome"] == "failed" and t.get("kind") != "reference" and t.get("tasks")
               and t["name"] != "test_builds"
               for t in report["bob"][0]["tests"])
    if told:
        assert bob["score"] < alice["score"], (bob["score"], alice["score"])
    assert alice["score"] > 0 or not any(t["outcome"] == "passed" and t.get("tasks") and t["name"] != "test_builds"
                                         for t in report["alice"][0]["tests"])
    # A single run writes the same mapping where --out says (alice's build is reused: same folder).
    single = tmp_path / "results.json"
    run = subprocess.run([COURSE, "grade", "00", "--impl", str(graded_class["submissions"] / "alice"),
                          "--format", "gradescope", "--out", str(single)], capture_output=True, text=True, timeout=1800)
    assert single.exists(), f"grade --format gradescope wrote nothing:\n{run.stdout[-3000:]}\n{run.stderr[-2000:]}"
    assert gradescope_results(single, points)["score"] == alice["score"]


def test_gradescope_out_needs_the_format():
    run = subprocess.run([COURSE, "grade", "00", "--out", "x.json"], capture_output=True, text=True)
    assert run.returncode == 2 and "--format gradescope" in run.stdout, run.stdout + run.stderr
    run = subprocess.run([COURSE, "grade", "00", "--leaderboard", "00"], capture_output=True, text=True)
    assert run.returncode == 2 and "--format gradescope" in run.stdout, run.stdout + run.stderr


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_crashing_and_hanging_kernels_fail_their_own_submission(tmp_path):
    submissions = tmp_path / "class"
    planted(submissions, "crasher", edits={"scale.cu": WILD_WRITE})
    planted(submissions, "hanger", edits={"scale.cu": SPIN_FOREVER})
    planted(submissions, "zoe")
    report, rows, output = grade_all(submissions, tmp_path / "grades.json", "--deadline", "90")
    by_student = {row["student"]: row for row in rows}
    assert by_student["zoe"]["failed"] == "0", f"a good submission graded after a crash must pass:\n{output}"
    crash = json.dumps(report["crasher"])
    assert "illegal" in crash.lower() or "died" in crash, f"no CUDA error text for the crashing kernel:\n{crash[:2000]}"
    assert "./course sanitize 00" in crash, "the crash report must give the compute-sanitizer command"
    hang = report["hanger"][0]
    assert "deadline" in hang.get("error", ""), f"the hanging kernel was not reported as hung: {hang.get('error')}"


ONE_PAST_THE_END = ("    y[i] = alpha * x[i];", "    y[i + 1] = alpha * x[i];")


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_sanitize_finds_a_write_one_past_the_end(tmp_path):
    """A write one element past the output: often invisible to the comparison, never to memcheck."""
    submission = planted(tmp_path, "off-by-one", edits={"scale.cu": ONE_PAST_THE_END})
    out = tmp_path / "sanitize.json"
    run = subprocess.run([COURSE, "sanitize", "00", "--impl", str(submission), "--tool", "memcheck",
                          "--json", str(out)],
                         capture_output=True, text=True, timeout=900)
    assert run.returncode == 1, f"./course sanitize passed a kernel that writes out of bounds:\n{run.stdout[-2000:]}"
    memcheck = json.loads(out.read_text())["tools"][0]
    # On the H200 (2026-11-21) memcheck reported this write as the kernel's launch failure
    # ("Program hit cudaErrorLaunchFailure"), with 3 errors in its summary.
    reported = any("Invalid __global__" in line or "launch failure" in line for line in memcheck["findings"])
    assert memcheck["errors"] > 0 and reported, (memcheck["findings"], memcheck["summaries"])


# ---------------------------------------------------------------- doctor
class FakeProbe(doctor.Probe):
    """A machine where everything is fine, unless a test breaks one thing."""

    def __init__(self, **broken):
        self.broken = broken

    def which(self, name):
        return None if name in self.broken.get("missing", ()) else f"/usr/bin/{name}"

    def run(self, command):
        if command[-1] == "--version" and "nvcc" in command[0]:
            return f"Cuda compilation tools, release {self.broken.get('nvcc', '13.0')}, V13.0.88"
        return "c++ (Debian 12.2.0) 12.2.0"

    def free_gb(self, path):
        return self.broken.get("free_gb", 80.0)

    def torch_facts(self, env):
        if self.broken.get("no_torch"):
            return {}
        return {"torch": "2.11.0+cu130", "cuda": "13.0", "gpu": None if self.broken.get("no_gpu") else "NVIDIA H100",
                "cc": None if self.broken.get("no_gpu") else "9.0", "arch_error": self.broken.get("arch_error"),
                "cuda_home": None if self.broken.get("no_cuda_home") else
                self.broken.get("cuda_home", "/usr/local/cuda")}

    def build_locks(self, build):
        return [build / "jit" / "labs" / "00-first-kernel" / "lock"] if self.broken.get("lock") else []

    def module_declarations(self, tree):
        name = self.broken.get("module_name", "TORCH_EXTENSION_NAME")
        return [(tree / "00-first-kernel" / "wrapper.cpp", 35, name)]

    def environ(self, name):
        return self.broken.get("environ", {}).get(name)

    def is_file(self, path):
        return path == "/usr/local/cuda/bin/nvcc"

    def memory(self):
        return 16, self.broken.get("memory_gib", 120.0)


def _doctor(**broken) -> dict:
    checks = doctor.checks(trees.ROOT, trees, course_env, FakeProbe(**broken))
    return {what: (ok, detail) for what, ok, detail in checks}


def test_doctor_all_good():
    assert all(ok for ok, _ in _doctor().values())


@pytest.mark.parametrize("broken, check, fix", [
    ({"missing": ("nvcc",)}, "nvcc", "install the CUDA toolkit"),
    ({"nvcc": "12.4"}, "nvcc vs torch CUDA", "install CUDA 13.x"),
    ({"missing": ("ninja",)}, "ninja", "pip install ninja"),
    ({"missing": ("c++", "g++")}, "host compiler", "apt-get install g++"),
    ({"no_gpu": True}, "GPU", "GPU tests are skipped"),
    ({"free_gb": 1.0}, "disk", "rm -rf build/"),
    ({"lock": True}, "build locks", "rm "),
    ({"no_torch": True}, "torch", "./course test once"),
    # The texts each FIX quotes were reproduced on a CPU machine with torch 2.11.0+cu130 (lessons/troubleshooting.md).
    ({"no_cuda_home": True}, "CUDA_HOME", "CUDA_HOME environment variable is not set"),
    ({"cuda_home": "/opt/cuda-gone"}, "CUDA_HOME", "/bin/sh: 1: /opt/cuda-gone/bin/nvcc: not found"),
    ({"environ": {"TORCH_CUDA_ARCH_LIST": "sm_90a"},
      "arch_error": "ValueError: Unknown CUDA arch (sm_90a) or GPU not supported"}, "TORCH_CUDA_ARCH_LIST",
     "Unknown CUDA arch (sm_90a)"),
    ({"environ": {"TORCH_CUDA_ARCH_LIST": "8.0"}}, "TORCH_CUDA_ARCH_LIST", "no kernel image is available"),
    ({"environ": {"TORCH_CUDA_ARCH_LIST": "9.0"}}, "TORCH_CUDA_ARCH_LIST", "set it to 9.0a"),
    ({"memory_gib": 4.0}, "compile memory", "export MAX_JOBS=2"),
    ({"module_name": "lab00"}, "module names", "labs/00-first-kernel/wrapper.cpp:35 names the module lab00"),
    ({"memory_gib": 4.0, "environ": {"MAX_JOBS": "8"}}, "compile memory", "(MAX_JOBS=8)"),
])
def test_doctor_explains_each_failure(broken, check, fix):
    results = _doctor(**broken)
    ok, detail = results[check]
    assert not ok and fix in detail, f"{check}: {detail}"


def test_doctor_accepts_a_good_arch_list_and_enough_memory():
    results = _doctor(environ={"TORCH_CUDA_ARCH_LIST": "8.0;9.0a+PTX", "MAX_JOBS": "2"}, memory_gib=4.0)
    assert results["TORCH_CUDA_ARCH_LIST"][0] and results["compile memory"][0]
    assert "TORCH_CUDA_ARCH_LIST" not in _doctor()  # unset: the grader sets it, nothing to check


# ---------------------------------------------------------------- the quick compute-sanitizer pass of `grade`
def lab_mutant(lab, name: str) -> mutants.Mutant:
    """One of a lab grader's own MUTANTS, by name (the planted bug is defined once, there)."""
    return next(m for m in importlib.import_module(lab.test_file.stem).MUTANTS if m.name == name)


@pytest.mark.skipif(not HAS_GPU, reason=NO_GPU_REASON)
def test_grade_runs_the_quick_sanitizer_pass_and_fails_a_race(tmp_path):
    """`./course grade` on a GPU runs memcheck, racecheck and synccheck over the grader's SANITIZE_CASES:
    the reference is clean, and a block reduce whose warps read shared memory before every warp has
    written it fails the lab with racecheck's own report (the comparison alone passes it on most runs)."""
    lab = trees.find_lab("03")
    race = lab_mutant(lab, "race-on-shared-partials")
    reports = {}
    for name, edits in (("reference", []), ("race", [(race.file, race.old, race.new)])):
        root = mutants.plant(lab, tmp_path / name, edits)
        out = tmp_path / f"{name}.json"
        run = subprocess.run([COURSE, "grade", "03", "--impl", str(root), "--json", str(out)], capture_output=True,
                             text=True, timeout=900)
        assert out.exists(), f"grade wrote no report:\n{run.stdout[-3000:]}"
        reports[name] = (json.loads(out.read_text())["results"][0], run.stdout)
    clean, output = reports["reference"]
    assert [r["tool"] for r in clean.get("sanitizer", [])] == ["memcheck", "racecheck", "synccheck"], output[-2000:]
    assert not clean.get("error"), f"the reference failed the quick sanitizer pass: {clean.get('error')}"
    per_tool = ", ".join(f"{row['tool']} {row['seconds']:.0f} s" for row in clean["sanitizer"])
    print(f"quick sanitizer pass over lab 03's reference: {clean['sanitizer_seconds']} s ({per_tool})")
    race, output = reports["race"]
    assert "racecheck" in (race.get("error") or ""), f"the race was not reported by racecheck:\n{output[-3000:]}"
    assert "Race reported" in race["error"] or "hazard" in race["error"].lower(), race["error"]


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


# ---------------------------------------------------------------- timings that cannot be gamed (harness.perf)
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




def test_a_build_the_machine_failed_is_compiled_once_more_then_called_the_graders(monkeypatch):
    """harness.build: a build that failed for the machine's reason (a compiler killed, out of memory) is compiled
    once more with MAX_JOBS=1; a second such failure raises BuildInfrastructureError (not the student's), a compile
    error is never retried."""
    from harness import build

    lab, tree = trees.find_lab("00"), trees.resolve_tree("solutions")
    attempts = []

    def compile_failing(*failures):
        def fake(*args):
            attempts.append(os.environ.get("MAX_JOBS"))
            failure = failures[min(len(attempts), len(failures)) - 1]
            if failure:
                raise RuntimeError(f"Error building extension 'x':\n{failure}")
            return "module"
        return fake

    oom = "nvcc error   : 'cicc' died due to signal 9 (Kill signal)"
    monkeypatch.setenv("MAX_JOBS", "8")
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(oom, None))
    assert build._compile_once_more_if_the_machine_failed(lab, tree, False, None) == "module"
    assert attempts == ["8", "1"] and os.environ["MAX_JOBS"] == "8"
    attempts.clear()
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(oom, oom))
    with pytest.raises(build.BuildInfrastructureError, match="not your code"):
        build._compile_once_more_if_the_machine_failed(lab, tree, False, None)
    attempts.clear()
    error = "scale.cu(12): error: identifier \"y\" is undefined"
    monkeypatch.setattr(build, "_compile_and_import", compile_failing(error))
    with pytest.raises(RuntimeError, match="is undefined"):
        build._compile_once_more_if_the_machine_failed(lab, tree, False, None)
    assert attempts == ["8"], "a compile error must not be retried"
