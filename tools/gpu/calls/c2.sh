source tools/gpu/call_prelude.sh
export COURSE_FLASH_BACKWARD_PATH=auto
step seeds 240 "COURSE_SEED=20261280 SEED_K='not test_aot and not test_stable' OUT=\$OUT bash tools/gpu/session.sh seeds '08 09' 5"
cp /dev/null /dev/null
TAIL=20 step blk 100 "COURSE_IMPL=solutions python3 -m pytest tests/test_09_custom_ops.py -k perf_block -q -p no:cacheprovider -rA"
step grade08 130 "time ./course grade 08 --impl solutions"
TAIL=8 step prof 60 "python3 tools/gpu/probe/lab09_block_profile.py eager"
cp $OUT/*.json $OUT/seed-*.txt $R/ 2>/dev/null
finish
