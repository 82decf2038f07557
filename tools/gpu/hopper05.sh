#!/usr/bin/env bash
# Lab 05 on the GPU box: the Hopper path's build (SASS), correctness and speed, then the mma.sync variants.
set -u
OUT=${OUT:-build/gpu-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 COURSE_SEED=${COURSE_SEED:-20261121}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader | tee "$OUT/gpu.txt"
./course build 05 --impl solutions -v 2>&1 | grep -E "ptxas info *: (Used|Compiling)|spill" | tee "$OUT/ptxas.txt" | tail -12
obj=$(ls build/jit/solutions/05-tensor-cores/linear_act_wgmma.cuda.o)
cuobjdump --dump-sass "$obj" | grep -oE "HGMMA\.[0-9A-Z.]*|UTMALDG[.0-9A-Z]*|USETMAXREG[.0-9A-Z]*|SYNCS[.A-Z]*" | sort | uniq -c | tee "$OUT/sass.txt"
timeout 300 python3 -m pytest tests/test_05_tensor_cores.py -k "wgmma and not perf" -x -q -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/wgmma-tests.txt"
timeout 200 ./course bench 05 --impl solutions --json 2>&1 | tail -20 | tee "$OUT/bench.txt"
cp site/data/bench/05-tensor-cores.json "$OUT/" 2>/dev/null
[ "${VARIANTS:-1}" = 1 ] && timeout 400 python3 tools/gpu/variants.py 05 @tools/gpu/lab05-variants.txt 2>&1 | tail -30 | tee "$OUT/variants.txt"
echo done
