#!/usr/bin/env bash
# A GPU-box session in phases, each fitting one 10-minute device call. Results land in $OUT.
#   bash tools/gpu/session.sh test "00 01"      grade the solutions (+ the notebooks), bench each lab
#   bash tools/gpu/session.sh tooling           the grader's self-tests: mutants, skeletons, crash/hang isolation
#   bash tools/gpu/session.sh sanitize "00 01"  compute-sanitizer's four tools over each lab's solution
#   bash tools/gpu/session.sh builds 00         cold build, then rebuild after touching only the kernel
#   bash tools/gpu/session.sh seeds "00 01" 5   the correctness tests (not perf, not large) of the solutions under
#                                               5 more seeds at once: issue 11's zero-false-failure runs
#                                               (SEED_K: a pytest -k expression for them)
# Run from the repository root, with .whl carried (nbclient and friends for the notebooks).
set -u
phase=${1:?phase: test, tooling, sanitize or builds}
labs=${2:-$(ls solutions | cut -c1-2 | tr '\n' ' ')}
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COURSE_SEED=${COURSE_SEED:-20261121}
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
case $phase in
  test)
    # shellcheck disable=SC2086
    ./course test $labs --json "$OUT/test.json" 2>&1 | tee "$OUT/test.txt" | grep -vE '^\s+(PASS|log:)'
    for lab in $labs; do ./course bench "$lab" --json 2>&1 | tee -a "$OUT/bench.txt" | grep -vE 'building and testing'; done
    cp site/data/bench/*.json "$OUT/" ;;
  tooling)
    python3 -m pytest tests/test_course_mutants.py tests/test_course_labgen.py tests/test_course_checks.py \
      tests/test_course_cli.py tests/test_course_skeletons.py tests/test_course_sanitizer.py \
      tests/test_course_runner.py tests/test_course_models.py tests/test_course_lint.py tests/test_course_grader.py \
      tests/test_course_perf.py tests/test_course_doctor.py \
      -q -p no:cacheprovider -rfE -k "${3:-not site}" 2>&1 | tee "$OUT/tooling.txt" | tail -40 ;;
  sanitize)
    for lab in $labs; do ./course sanitize "$lab" --impl solutions --json "$OUT/sanitize-$lab.json" 2>&1 | tee -a "$OUT/sanitize.txt"; done ;;
  builds)
    first=$(echo "$labs" | cut -d' ' -f1)
    kernel=$(ls solutions/"$first"-*/*.cu | head -1)
    { ./course build "$first" --impl solutions --clean; touch "$kernel"; ./course build "$first" --impl solutions; } 2>&1 \
      | grep '\[course\] built' | tee "$OUT/build-times.txt" ;;
  seeds)
    # Correctness runs share the GPU safely (timings are not among them); the builds come first, one lab
    # per process, so that the seeds' processes find them done instead of racing for the same build.
    for lab in $labs; do ./course build "$lab" --impl solutions >/dev/null 2>&1 & done; wait
    files=$(for lab in $labs; do ls tests/test_"$lab"_*.py; done)
    # The model tests run float64 on the CPU with torch's threads: split the cores, or N processes of nproc
    # threads each stall (2026-11-26: five processes of labs 08/09 sat at test_model_forward[1023x1024] 200 s).
    export OMP_NUM_THREADS=$(( $(nproc) / ${3:-5} > 0 ? $(nproc) / ${3:-5} : 1 ))
    for i in $(seq 1 "${3:-5}"); do
      # shellcheck disable=SC2086
      COURSE_SEED=$((COURSE_SEED + i)) python3 -m pytest $files -m "not perf and not large" -k "${SEED_K:-}" -q \
        -p no:cacheprovider -rfE >"$OUT/seed-$((COURSE_SEED + i)).txt" 2>&1 &
    done
    wait
    for f in "$OUT"/seed-*.txt; do echo "$(basename "$f" .txt): $(tail -1 "$f")"; done ;;
esac
tar czf "$OUT/logs.tgz" build/logs 2>/dev/null
echo "phase $phase done"
