# Sourced at the top of a device call's command (`source tools/gpu/call_prelude.sh; step NAME SECS "cmd"; ...;
# finish`): installs the carried notebook wheels, prints the GPU, runs each step with a deadline into $OUT/r/NAME.txt
# and prints its tail, and `finish` packs $OUT/r (and build/logs) into one $OUT/r.tgz, because a call brings back
# only a few files (the 2026-11-26 session lost six profile JSONs to that limit before it packed them).
# sourced by each call: wheels, env, a step runner that times each step and keeps its log; everything the call
# writes goes to $R (= $OUT/r), packed into $OUT/r.tgz at the end (the device returns at most a few files)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 MAX_JOBS=16
R=$OUT/r; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
step() {  # step NAME SECONDS CMD...: run with a deadline, log to $R/NAME.txt, print the tail
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  OUT=$R timeout -k 5 "$secs" bash -c "$*" >"$R/$name.txt" 2>&1
  local rc=$?
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"
  tail -n "${TAIL:-15}" "$R/$name.txt"
}
finish() { cp -r build/logs "$R/logs" 2>/dev/null; tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"; echo done; }
