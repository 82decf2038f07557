# racecheck over one lab's quick cases (SANITIZE_CASES) under variants of the command, one line each: with and without
# the --kernel-name filter, the caching allocator, --racecheck-memcpy-async. bash tools/gpu/probe/racecheck_variants.sh 05 base nofilter caching noasync
lab=$1; shift
file=$(ls tests/test_${lab}_*.py)
regex=$(python3 -c "import sys; sys.path.insert(0,'tools/course'); import sanitizer; print('|'.join(sanitizer.lab_kernels('$lab','solutions')))")
compute-sanitizer --version | tail -1
compute-sanitizer --help | grep -i -A1 "racecheck-" | head -30
run() {  # run NAME ENVS -- FLAGS
  local name=$1; shift
  local t0=$(date +%s)
  env COURSE_IMPL=solutions "$@" python3 -m pytest $file -q -p no:cacheprovider -m "sanitize and not perf and not large" -k "not notebook and not current_stream" > $OUT/$lab-$name.log 2>&1
  echo "$lab $name rc=$? $(( $(date +%s) - t0 ))s: $(grep -m1 -E 'Internal Sanitizer Error|hardware exception' $OUT/$lab-$name.log) | $(grep -E 'SUMMARY' $OUT/$lab-$name.log | tail -1) | $(tail -1 $OUT/$lab-$name.log | cut -c1-120)"
}
for v in "$@"; do
  case $v in
    base) run base PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck --racecheck-report hazard --kernel-name regex=$regex ;;
    nofilter) run nofilter PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck --racecheck-report hazard ;;
    caching) run caching compute-sanitizer --tool racecheck --racecheck-report hazard --kernel-name regex=$regex ;;
    noasync) run noasync PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool racecheck --racecheck-report hazard --racecheck-memcpy-async no --kernel-name regex=$regex ;;
  esac
done
