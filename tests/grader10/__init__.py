"""Lab 10's grader helpers (tests/test_10_cutlass.py is the grader): cute_layouts.py checks lesson 10's CuTe layouts
against lesson 05's formulas, element by element (`pytest tests/grader10/cute_layouts.py`). Not named lab10/: that
is the lab's compiled extension's name.
"""
