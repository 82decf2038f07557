source tools/gpu/call_prelude.sh
export COURSE_FLASH_BACKWARD_PATH=hopper
V=build/variants/08-flash-attention/allarrive
python3 - <<'PY'
import sys; sys.path.insert(0, "tests")
from harness import trees
from harness.mutants import plant
f = "flash_backward_hopper.cu"
plant(trees.find_lab("08"), trees.BUILD / "variants" / "08-flash-attention" / "allarrive", [
    (f, "constexpr int kEmptyArrivals = kConsumers * kWarpgroupThreads / kWarpSize;", "constexpr int kEmptyArrivals = kConsumers * kWarpgroupThreads;"),
    (f, "    __syncwarp();\n    if (lane == 0) hopper::barrier_arrive(&empty[stage]);", "    hopper::barrier_arrive(&empty[stage]);")])
PY
(./course build 08 --impl $V >/dev/null 2>&1 &); ./course build 09 --impl solutions > /dev/null 2>&1
TAIL=12 step race08v 100 "./course sanitize 08 --impl $V --tool racecheck --shards 4 -k 'test_flash_backward and not deterministic and not large'"
TAIL=12 step bwdbase 60 "python3 tools/gpu/probe/lab08_hopper_bwd.py --quick"
TAIL=12 step bwdvar 60 "python3 tools/gpu/probe/lab08_hopper_bwd.py --quick --impl $V"
unset COURSE_FLASH_BACKWARD_PATH
step seeds 200 "COURSE_SEED=20261280 SEED_K='not test_aot and not test_stable' bash tools/gpu/session.sh seeds '08 09' 5"
finish
