source tools/gpu/call_prelude.sh
TAIL=45 step hopperbwd 170 "python3 tools/gpu/probe/lab08_hopper_bwd.py --quick"
if grep -q "FAIL\|Error\|error" $R/hopperbwd.txt || ! grep -q "ok" $R/hopperbwd.txt; then
  step grade08 200 "time ./course grade 08 --impl solutions"
else
  TAIL=25 step test08h 160 "COURSE_FLASH_BACKWARD_PATH=hopper ./course test 08 --impl solutions"
  step blk 110 "./course test 09 --impl solutions -k perf_block"
  TAIL=40 step prof 100 "python3 tools/gpu/probe/lab09_block_profile.py compiled"
fi
cp $OUT/*.json $R/ 2>/dev/null
finish
