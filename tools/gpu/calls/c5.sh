source tools/gpu/call_prelude.sh
TAIL=6 step beside 70 "COURSE_IMPL=solutions python3 -m pytest tests/test_09_custom_ops.py -k beside -q -p no:cacheprovider -rfE"
TAIL=8 step test08h 70 "COURSE_FLASH_BACKWARD_PATH=hopper ./course test 08 --impl solutions"
TAIL=25 step grade09 160 "time ./course grade 09 --impl solutions"
step seeds 140 "COURSE_SEED=20261285 SEED_K='not test_aot and not test_stable' bash tools/gpu/session.sh seeds '08 09' 5"
finish
