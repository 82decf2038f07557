# Sourced at the top of a device call's command (`source tools/gpu/call_prelude.sh; step NAME SECS "cmd"; ...;
# finish`): installs the carried notebook wheels, prints the GPU, runs each step with a deadline into $OUT/r/NAME.txt
# and prints its tail, and `finish` packs $OUT/r (and build/logs) into one $OUT/r.tgz, because a call brings back
# only a few files (the 2026-11-26 session lost six profile JSONs to that limit before it packed them).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>/dev/null && export PYTHONPATH=/tmp/site
export PYTHONUNBUFFERED=1 MAX_JOBS=16
R=$OUT/r; mkdir -p "$R"
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv,noheader | tee "$R/gpu.txt"
step() {  # step NAME SECONDS CMD...: run with a deadline, log to $R/NAME.txt, print the tail
  local name=$1 secs=$2; shift 2
  local t0=$(date +%s)
  OUT=$R timeout -k 5 "$secs" bash -c "$*" >"$R/$name.txt" 2>&1
  local rc=$?
  # timeout signals its process group; a pytest started in a session of its own is not in it. ./course stops its
  # own on SIGTERM (cli.run_command); this catches the rest (the graders that mutant and seed runs start), which
  # would share the GPU with the next step's timings (2026-11-27: a leftover racecheck slowed lab 02's transposes)
  if [ $rc -ge 124 ]; then pkill -9 -f 'compute-sanitizer|pytest|course (test|sanitize|bench|grade|profile)' 2>/dev/null; sleep 2; fi
  echo "=== $name rc=$rc $(( $(date +%s) - t0 ))s"
  tail -n "${TAIL:-15}" "$R/$name.txt"
}
finish() { cp -r build/logs "$R/logs" 2>/dev/null; tar czf "$OUT/r.tgz" -C "$OUT" r && rm -rf "$R"; echo done; }
