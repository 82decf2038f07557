"""`./course doctor` (tools/course/doctor.py) on a faked machine: with everything in place every check passes, and
each failure it knows how to explain (nvcc, ninja or a host compiler missing, a CUDA mismatch with torch, no GPU, a
full disk, stale build locks, no torch, CUDA_HOME, TORCH_CUDA_ARCH_LIST, too little memory for the compile, a wrong
module name) fails its check with the fix in its text."""
from __future__ import annotations

import doctor  # noqa: E402
import pytest

from coursekit import env as course_env
from coursekit import trees


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


@pytest.mark.parametrize("capability, column, lab08", [
    ("7.5", "T4", "rungs 1-2"), ("8.6", "sm_80-89", "all rungs and the backward"),
    ("9.0", "sm_90", "the Hopper section"), ("12.0", "sm_80-89", "all rungs and the backward")])
def test_doctor_says_what_the_gpu_runs_from_the_home_pages_table(capability, column, lab08):
    """doctor.what_runs reads site/data/support.json, the data of the home page's table: a row a lab group, the
    column of the GPU's compute capability; a GPU newer than the table's (Blackwell) takes the column the table
    names for it, with its note (sm_90a code runs on 9.0 alone)."""
    lines = doctor.what_runs(trees.ROOT, capability)
    assert column in lines[0] and len(lines) == (8 if capability == "12.0" else 7), lines
    assert lab08 in next(line for line in lines if "08 flash attention" in line)


def test_doctor_says_a_gpu_older_than_the_course_runs_nothing():
    assert "needs 7.5 or newer" in doctor.what_runs(trees.ROOT, "6.1")[0]
    assert doctor.what_runs(trees.ROOT, None) == []
