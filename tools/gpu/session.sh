#!/usr/bin/env bash
# One GPU-box session: install carried wheels, check the toolchain, run the suite on the
# solutions, time cold and warm builds, benchmark each lab, and leave everything in $OUT.
#   usage: bash tools/gpu/session.sh "00 01"     (labs to benchmark; default: all)
# Run from the repository root on the GPU machine (the device tool), with .whl carried.
set -u
OUT=${OUT:-build/gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
labs=${1:-$(ls solutions | cut -c1-2 | tr '\n' ' ')}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/gpu.txt"
./course doctor | tee "$OUT/doctor.txt"

# Build times: cold (empty build dir), then warm after touching only the first lab's kernel.
first=$(echo $labs | cut -d' ' -f1)
kernel=$(ls solutions/${first}-*/*.cu | head -1)
{ ./course build "$first" --impl solutions --clean
  touch "$kernel"
  ./course build "$first" --impl solutions
} 2>&1 | grep '\[course\] built' | tee "$OUT/build-times.txt"

./course test --json "$OUT/test.json" 2>&1 | tee "$OUT/test.txt"
for lab in $labs; do
  ./course bench "$lab" --json 2>&1 | tee -a "$OUT/bench.txt"
done
cp site/data/bench/*.json "$OUT/" 2>/dev/null
tar czf "$OUT/logs.tgz" build/logs 2>/dev/null
echo "session done"
