#!/usr/bin/env bash
# The three speed-gap probes of issues 12 and 13 in one device call (NOTES.md@8a81008, "Probes for the three speed
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
# Each probe's path (lessons 06 and 07's sit beside the evidence files they wrote).
PROBES="site/data/evidence/06-fused-elementwise/gelu_erf.py site/data/evidence/07-fused-normalization/softmax_onepass.py
site/data/evidence/07-fused-normalization/rms_bwd.py"
for path in $PROBES; do
  probe=$(basename "$path" .py)
  timeout 200 python3 "$path" --build-only >"$OUT/$probe.build.txt" 2>&1 &
done
wait
echo "builds: $(($(date +%s) - start)) s" | tee "$log"
limits=(110 110 150)
i=0
for path in $PROBES; do
  probe=$(basename "$path" .py)
  t=$(date +%s)
  timeout "${limits[$i]}" python3 "$path" 2>&1 | tee "$OUT/$probe.txt"
  echo "$probe: exit ${PIPESTATUS[0]}, $(($(date +%s) - t)) s" | tee -a "$log"
  i=$((i + 1))
done
echo "total: $(($(date +%s) - start)) s" | tee -a "$log"
