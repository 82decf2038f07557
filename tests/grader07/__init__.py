"""The parts of lab 07's grader, whose tests tests/test_07_fused_normalization.py gathers (its docstring says which
part holds what). Not named lab07: that is the name of the lab's compiled extension module."""
