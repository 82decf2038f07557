#!/usr/bin/env bash
# The three speed-gap probes of issues 12 and 13 in one device call (tools/gpu/NOTES.md, "Probes for the three speed
# gaps"): the three builds (each probe's extension, labs 06 and 07) in parallel first, then each probe alone on the
# GPU, so that no timing overlaps a build or another probe. Everything lands in $OUT: <probe>.txt (the tables),
# <probe>.build.txt, the probes' JSON, next_session.txt (exit codes and seconds).
#   bash tools/gpu/probe/next_session.sh        (from the repository root; ~4-5 minutes expected on an H100)
# Time limits keep one stuck probe (a cluster kernel that never leaves its barrier, say) from eating the call:
# builds 200 s, then 110 / 110 / 150 s; 570 s at worst, under the device tool's 600 s a command.
set -u
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
log="$OUT/next_session.txt"
start=$(date +%s)
# Each probe by its path (lab 06's lives next to the lesson's evidence files).
declare -A PROBE=([lab06_gelu_erf]=site/data/evidence/06-fused-elementwise/gelu_erf.py
                  [lab07_softmax_onepass]=tools/gpu/probe/lab07_softmax_onepass.py
                  [lab07_rms_bwd]=tools/gpu/probe/lab07_rms_bwd.py)
for probe in lab06_gelu_erf lab07_softmax_onepass lab07_rms_bwd; do
  timeout 200 python3 "${PROBE[$probe]}" --build-only >"$OUT/$probe.build.txt" 2>&1 &
done
wait
echo "builds: $(($(date +%s) - start)) s" | tee "$log"
for spec in lab06_gelu_erf:110 lab07_softmax_onepass:110 lab07_rms_bwd:150; do
  probe=${spec%%:*}
  t=$(date +%s)
  timeout "${spec##*:}" python3 "${PROBE[$probe]}" 2>&1 | tee "$OUT/$probe.txt"
  echo "$probe: exit ${PIPESTATUS[0]}, $(($(date +%s) - t)) s" | tee -a "$log"
done
echo "total: $(($(date +%s) - start)) s" | tee -a "$log"
