#!/usr/bin/env bash
# Lab 10's first GPU run (issue 18): one device call of at most 8 minutes, from the repository root, with .whl/
# carried: it must hold nvidia_cutlass-4.2.0.0-py3-none-any.whl (the box has no network; tools/course/cutlass.py
# finds the wheel in .whl/ and installs CUTLASS's headers from it with pip --no-index into the course cache) and the
# notebook wheels (nbclient, ipykernel, ...) for the notebook test.
#   bash tools/gpu/probe/lab10_first_run.sh        results: $OUT/r.tgz (one log per step, test10.json, the bench JSON)
# Each step has a deadline (call_prelude.sh's step: log in $R/NAME.txt, its tail printed); they sum to 470 s.
set -u
# shellcheck source=../call_prelude.sh
source tools/gpu/call_prelude.sh
# 1. the headers, offline, from the carried wheel: prints the two include folders, then doctor's line.
step cutlass 15 "python3 tools/course/cutlass.py && python3 tools/course/cutlass.py --check"
# 2. cold builds: lab 10 (its CUTLASS file took 90-115 s on a loaded 2-core machine without a GPU) beside lesson 05's
#    solutions (the perf cases' yardstick). '[course] built 10-cutlass ... in N s' is lab 10's cold build time, with
#    lab 05 compiling on other cores at the same time. No -v: its ptxas flag would make the grader rebuild.
step build 210 "./course build 05 --impl solutions & ./course build 10 --impl solutions --clean; wait"
# 3. the grader over the solutions: correctness, errors, CUDA graph, notebook, perf (4 cases), quick sanitizer pass.
step test 170 "./course test 10 --impl solutions --json \$OUT/test10.json"
# 4. the bench JSON (site/data/bench/10-cutlass.json), copied out.
step bench 75 "./course bench 10 --impl solutions --json && cp site/data/bench/10-cutlass.json \$OUT/"
finish
