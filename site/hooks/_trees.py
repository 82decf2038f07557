"""tests/harness/trees.py, the one module that knows the repository's paths, for the hooks.

Not a hook itself (mkdocs.yml does not list it): the hooks `from _trees import trees` (mkdocs puts
a hook's folder on sys.path while it loads the hook). trees.py is loaded by file path, once per
process and under the same name as tools/course/env.py's load_trees(): importing the
tests.harness package would import torch.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _load():
    module = sys.modules.get("course_trees")
    if module is None:
        path = Path(__file__).resolve().parents[2] / "tests" / "harness" / "trees.py"
        spec = importlib.util.spec_from_file_location("course_trees", path)
        module = sys.modules["course_trees"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    return module


trees = _load()
