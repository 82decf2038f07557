"""coursekit: the course's core, one importable package that every entry point shares.

    trees    where things live: the repository's trees, labs and build folders, and the names the CLI and the
             grader agree on (environment variables, build kinds)
    jit      the grader's build rules (flags, arch list, a lab's sources), the notebook build and the CUDA-event
             timer: a notebook builds and times a lab exactly as the grader does
    env      which python runs the tests and the site, and installing what it lacks
    folders  build folders that concurrent grading runs share: one builder at a time, outputs published whole
    cutlass  CUTLASS's headers from the pinned nvidia-cutlass wheel (python3 -m coursekit.cutlass)

Standard library only at import time (torch is imported inside the functions that need it), so the torch-free CLI
imports it as the grader does. Its modules import each other relatively (`from . import trees`); this file imports
nothing.

How each entry point finds it: the repository root is the import root, set once per entry point, never per file.
  - ./course (the bash launcher) exports PYTHONPATH=<root>:<root>/tests before it runs tools/course/cli.py; every
    child inherits it: pytest, mkdocs and its hooks, notebook kernels, and scripts run with `./course run SCRIPT`
    (the probes under site/data/evidence/ and tools/gpu/);
  - pytest.ini at the root gives a plain `pytest` the same (pythonpath = . tests tools/course);
  - a notebook puts the root on sys.path itself (it has no entry point), then `from coursekit import jit`;
  - lab 09's setup.py builds get the root on PYTHONPATH from the grader that starts them (trees.pythonpath()).
"""
