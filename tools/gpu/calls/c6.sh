source tools/gpu/call_prelude.sh
step nb00 60 "COURSE_SEED=20261274 python3 -m pytest tests/test_00_first_kernel.py -k notebook -q -p no:cacheprovider -rfE 2>&1 | tail -3"
step grade08 90 "time ./course grade 08 --impl solutions"
step grade09 230 "time ./course grade 09 --impl solutions"
finish
