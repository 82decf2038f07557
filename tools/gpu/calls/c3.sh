source tools/gpu/call_prelude.sh
F=tools/gpu/lab07-rms-bwd-variants.txt
TAIL=30 step race08 110 "COURSE_FLASH_BACKWARD_PATH=hopper ./course sanitize 08 --impl solutions --tool racecheck --shards 4 -k 'test_flash_backward and not deterministic and not large'"
step seeds 180 "COURSE_SEED=20261280 SEED_K='not test_aot and not test_stable' bash tools/gpu/session.sh seeds '08 09' 5"
TAIL=30 step var07 150 "python3 tools/gpu/variants.py 07 \"\$(grep '^2rows-raw-direct:' $F)\" && ./course test 07 --impl build/variants/07-fused-normalization/2rows-raw-direct"
TAIL=30 step race07 120 "./course sanitize 07 --impl solutions --tool racecheck --shards 8"
finish
