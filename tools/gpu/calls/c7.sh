source tools/gpu/call_prelude.sh
step hopperbwd 80 "python3 tools/gpu/probe/lab08_hopper_bwd.py --quick"
finish
