"""Simulating an older GPU (COURSE_TARGET_ARCH=7.5, 8.0, 8.6, 8.9), the parts a machine without a GPU can check: the
limits table and the text the kernels' host code parses (include/course/target.h, compiled here with a plain C++
compiler), the PTX-only arch list, the build folders of their own, and a clear error for an arch the course does not
simulate. The simulated runs themselves (every lab's correctness suite in each mode) are the GPU box's.
"""
from __future__ import annotations

import shutil
import subprocess

import pytest

from coursekit import jit, trees

# What target.h's parser prints for a COURSE_TARGET_LIMITS text: active major minor sms threads blocks optin per_sm l2.
_PRINTER = r"""
#include <cstdio>
#include "course/target.h"
int main(int argc, char** argv) {
  const course::TargetLimits t = course::parse_target_limits(argc > 1 ? argv[1] : nullptr);
  std::printf("%d %d %d %d %d %d %d %d %d %d\n", t.active, t.major, t.minor, t.sms, t.threads_per_sm, t.blocks_per_sm,
              t.shared_per_block_optin, t.shared_per_sm, t.l2_bytes, course::capped(100, t.sms));
}
"""


@pytest.fixture(scope="module")
def printer(tmp_path_factory):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("needs a C++ compiler")
    folder = tmp_path_factory.mktemp("target")
    (folder / "main.cpp").write_text(_PRINTER)
    subprocess.run([compiler, "-std=c++17", "-I", str(trees.ROOT / "include"), "main.cpp", "-o", "print"],
                   cwd=folder, check=True, capture_output=True)
    return lambda *args: subprocess.run([str(folder / "print"), *args], capture_output=True, text=True,
                                        check=True).stdout.split()


@pytest.mark.parametrize("arch", list(jit.TARGET_GPUS))
def test_the_kernels_read_the_limits_the_grader_writes(printer, arch):
    gpu = jit.TARGET_GPUS[arch]
    major, minor = map(int, arch.split("."))
    fields = [1, major, minor, gpu["sms"], gpu["threads_per_sm"], gpu["blocks_per_sm"], gpu["shared_per_block_optin"],
              gpu["shared_per_sm"], gpu["l2_bytes"], min(100, gpu["sms"])]
    assert printer(jit.target_limits_text(arch)) == [str(f) for f in fields]


def test_no_simulation_without_the_variable_or_a_major(printer):
    assert printer()[0] == "0"
    assert printer("")[0] == "0"
    assert printer("sms=40;bogus=3")[:4] == ["0", "0", "0", "40"], "no major: no simulation (unknown keys ignored)"
    assert printer("major=7;minor=5")[-1] == "100", "a limit left out limits nothing"


def test_simulation_builds_ptx_for_the_older_gpu_in_folders_of_its_own(monkeypatch):
    monkeypatch.setenv(jit.TARGET_ARCH_ENV, "7.5")
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0a")  # set by someone else: the simulation must still win
    assert jit.publish_target_limits() == "7.5"
    assert jit.ensure_arch_list() == "7.5+PTX"
    assert jit.capability() == (7, 5)
    assert "major=7;minor=5;sms=40" in jit.target_limits_text("7.5")
    lab = trees.find_lab("00")
    assert lab.build_dir(trees.resolve_tree("solutions")).parts[-3] == "jit-sm75"
    assert jit.TARGET_ARCH_ENV == trees.TARGET_ARCH_ENV
    monkeypatch.delenv(jit.TARGET_ARCH_ENV)
    assert jit.publish_target_limits() is None
    assert lab.build_dir(trees.resolve_tree("solutions")).parts[-3] == "jit"


def test_an_arch_the_course_does_not_simulate_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(jit.TARGET_ARCH_ENV, "6.1")
    with pytest.raises(ValueError, match="simulates compute capability 7.5, 8.0, 8.6, 8.9"):
        jit.simulated_arch()
