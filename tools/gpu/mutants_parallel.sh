#!/usr/bin/env bash
# The grader's own mutant tests (tests/test_course_mutants.py) in several processes at once, one group of
# mutants each: every mutant is a cold build of its lab, and one process after another does not fit a
# 10-minute device call. Correctness mutants only (perf mutants time the GPU: tools/gpu/probe/perf_mutants.py).
#   bash tools/gpu/mutants_parallel.sh "06-scalar-bound or 06-vector-bound" "07-no-max or 07-online" ...
# One summary line per group; logs in $OUT/mutants-N.txt.
set -u
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
i=0
for group in "$@"; do
  i=$((i + 1))
  python3 -m pytest tests/test_course_mutants.py -q -p no:cacheprovider -rfE -k "$group" >"$OUT/mutants-$i.txt" 2>&1 &
done
wait
for f in "$OUT"/mutants-*.txt; do echo "$(basename "$f" .txt): $(tail -1 "$f")"; grep -E "^FAILED" "$f"; done
