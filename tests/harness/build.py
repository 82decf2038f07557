"""JIT-build a lab with torch.utils.cpp_extension.load: one build dir per (tree, lab).

`load` writes a ninja file that compiles every source to its own object, so
editing one kernel `.cu` recompiles that object and relinks; the host wrapper
(the only file that includes torch headers, and the slow one) is not rebuilt.
"""
from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from dataclasses import dataclass

from coursekit import jit, trees

from . import timing

_built: dict[tuple[str, str], object] = {}
# A submission that does not compile fails the same way for every test that touches it: build
# it once per process and hand the same error to the rest (load() would re-run ninja each time).
_failed: dict[tuple[str, str], Exception] = {}
# One line per compile attempt, in the build folder: how often a grading run invoked the compiler.
ATTEMPTS_LOG = "build-attempts.log"
# A build that failed for a reason outside the code it compiles: the machine ran out of memory or disk, a compiler
# was killed, a file was held by another process. Compiled once more with one job at a time; a second such failure is
# the grader's (BuildInfrastructureError), never the student's.
_INFRASTRUCTURE = re.compile(r"Killed signal terminated program|signal 9|No space left on device|"
                             r"Cannot allocate memory|virtual memory exhausted|std::bad_alloc|out of memory|"
                             r"Resource temporarily unavailable|Text file busy|Bus error|cannot create temporary file",
                             re.IGNORECASE)


class BuildInfrastructureError(RuntimeError):
    """The build could not run (INFRASTRUCTURE's causes, twice): nothing is known about the code it compiles."""


def infrastructure_failure(error: BaseException) -> str | None:
    """The line of a build error that says the build itself could not run, or None (a compile error: the code's)."""
    for line in str(error).splitlines():
        if _INFRASTRUCTURE.search(line):
            return line.strip()[:300]
    return None
# The flags, the arch rule and the load() call itself live in jit.py, which the notebooks use too.


def module_name(lab: trees.Lab, tree: trees.Tree) -> str:
    # Distinct per tree, so a process can hold the labs and the solutions builds at once.
    return f"course_{tree.tag}_{lab.module_stem}"


@dataclass(frozen=True)
class OpLibrary:
    """The build of an op library (jit.is_op_library: lab 09): no Python module to import. load() has loaded
    the shared library at `path` (torch.ops.load_library), whose TORCH_LIBRARY blocks registered the ops in
    torch.ops.<namespace>, the module name (TORCH_EXTENSION_NAME in the build)."""

    path: str
    namespace: str

    @property
    def ops(self):
        """torch.ops.<namespace>: the library's ops, as the dispatcher holds them."""
        import torch

        return getattr(torch.ops, self.namespace)


def build(lab: trees.Lab, tree: trees.Tree, verbose: bool = False, extra_cuda_cflags: list[str] | None = None):
    """Compile (or reuse) the lab in `tree` and return the imported module (an OpLibrary for an op library)."""
    key = (tree.tag, lab.name)
    if not extra_cuda_cflags:
        if key in _built:
            return _built[key]
        if key in _failed:
            raise _failed[key]
        same = same_build_elsewhere(lab, tree)  # its files hashed once: the answer is kept under this tree's key
        if same is not None:
            try:
                _built[key] = build(lab, same, verbose)
            except Exception as error:
                _failed[key] = error
                raise
            return _built[key]
    timing.build_started()
    try:
        module = _compile_once_more_if_the_machine_failed(lab, tree, verbose, extra_cuda_cflags)
    except Exception as error:
        _failed[key] = error
        timing.build_ended(failed=True, infrastructure=infrastructure_failure(error))
        raise
    timing.build_ended(failed=False)
    _built[key] = module
    return module


# Files the compiler never reads: a tree that differs from another only in these builds to the same library.
NOT_COMPILED = (".py", ".pyc", ".ipynb", ".md", ".json", ".log")


def compiled_files(lab: trees.Lab, tree: trees.Tree) -> dict[str, str]:
    """Every file of the lab's folder (and of the labs it compiles in, depends.txt) that a build may read, by path
    relative to the tree, with its content's hash."""
    folder = lab.dir_in(tree)
    found = {}
    for top in (folder, *jit.lab_dependencies(folder)):
        for path in sorted(top.rglob("*")):
            if path.is_file() and path.suffix not in NOT_COMPILED and "__pycache__" not in path.parts:
                found[str(path.relative_to(folder.parent))] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def same_build_elsewhere(lab: trees.Lab, tree: trees.Tree) -> trees.Tree | None:
    """The tree in BUILD_FROM_ENV when its build of `lab` is this tree's too: its compiled files are the same in
    both (an op library's ops then carry that tree's module name as their namespace, which the graded tree's ops.py
    is given). None otherwise: the lab is compiled from `tree` as always."""
    other = os.environ.get(trees.BUILD_FROM_ENV)
    if not other or not lab.dir_in(tree).is_dir():
        return None
    source = trees.resolve_tree(other)
    if source.tag == tree.tag or not lab.dir_in(source).is_dir():
        return None
    return source if compiled_files(lab, tree) == compiled_files(lab, source) else None


def _compile_once_more_if_the_machine_failed(lab, tree, verbose: bool, extra_cuda_cflags):
    """_compile_and_import; where it failed for the machine's reason (infrastructure_failure), once more with one
    compile job (less memory), and a second such failure raised as BuildInfrastructureError."""
    try:
        return _compile_and_import(lab, tree, verbose, extra_cuda_cflags)
    except Exception as error:
        first = infrastructure_failure(error)
        if not first:
            raise
        print(f"[course] {lab.name}: the build could not run ({first}); once more, one compile job at a time",
              flush=True)
        saved = os.environ.get("MAX_JOBS")
        os.environ["MAX_JOBS"] = "1"
        try:
            return _compile_and_import(lab, tree, verbose, extra_cuda_cflags)
        except Exception as again:
            if infrastructure_failure(again):
                raise BuildInfrastructureError(
                    f"not checked: the grader's build of {lab.name} could not run, twice (not your code): "
                    f"{infrastructure_failure(again)}") from again
            raise
        finally:
            if saved is None:
                os.environ.pop("MAX_JOBS", None)
            else:
                os.environ["MAX_JOBS"] = saved


def _compile_and_import(lab: trees.Lab, tree: trees.Tree, verbose: bool, extra_cuda_cflags: list[str] | None):
    folder = lab.dir_in(tree)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder} does not exist: the submission has no folder for lab {lab.name}")
    build_dir = lab.build_dir(tree)
    build_dir.mkdir(parents=True, exist_ok=True)
    with open(build_dir / ATTEMPTS_LOG, "a") as log:
        log.write(f"{time.time():.3f} pid {os.getpid()}\n")
    name = module_name(lab, tree)
    try:
        built = jit.load_lab(folder, trees.ROOT, name=name, extra_cuda_cflags=extra_cuda_cflags or (),
                             verbose=verbose, build_dir=build_dir)
    except ImportError as error:
        # load() imports without rebuilding when it thinks nothing changed (e.g. after a
        # compile was interrupted); run ninja ourselves so the real compiler error shows.
        result = subprocess.run(["ninja", "-v"], cwd=build_dir, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"Error building extension:\n{result.stdout}{result.stderr}") from None
        raise error
    # load() returns an op library's path (a str), already loaded into the process.
    return OpLibrary(built, name) if isinstance(built, str) else built


def main(argv: list[str] | None = None) -> int:
    """`./course build`: PYTHONPATH=tests python -m harness.build LAB [--impl TREE] [-v] [--clean]"""
    import argparse
    import shutil
    import sys

    parser = argparse.ArgumentParser(prog="python -m harness.build",
                                     description="compile one lab as the grader does, and report the time")
    parser.add_argument("lab", help="lab number, name or slug (e.g. 00)")
    parser.add_argument("--impl", default="labs", help="labs, solutions, or a folder laid out like labs/")
    parser.add_argument("-v", "--verbose", action="store_true", help="the compiler commands and ptxas's report")
    parser.add_argument("--clean", action="store_true", help="delete the build folder first (a cold build)")
    args = parser.parse_args(argv)
    try:
        lab, tree = trees.find_lab(args.lab), trees.resolve_tree(args.impl)
    except (KeyError, FileNotFoundError) as error:
        print(error.args[0] if error.args else error, file=sys.stderr)
        return 2
    if args.clean:
        shutil.rmtree(lab.build_dir(tree), ignore_errors=True)
    started = time.perf_counter()
    try:
        build(lab, tree, verbose=args.verbose, extra_cuda_cflags=list(jit.PTXAS_REPORT) if args.verbose else None)
    except Exception as error:  # the compiler's output arrives in the message
        print(f"{error}\n[course] {lab.name} from {tree.path} did not build", file=sys.stderr)
        return 1
    print(f"[course] built {lab.name} from {tree.path} in {time.perf_counter() - started:.1f} s "
          f"(arch list {jit.ensure_arch_list()}, build dir {lab.build_dir(tree)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
