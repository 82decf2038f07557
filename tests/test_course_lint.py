"""`./course lint`'s size budgets (tools/course/sizes.py): Python functions measured by the AST and C++/CUDA functions
by their braces, an allow-list whose entries may not grow and must leave once they fit, and the repository itself
within its budgets."""
from __future__ import annotations


def test_size_budgets_find_long_functions_and_the_allow_list_only_shrinks():
    """./course lint's size budgets (tools/course/sizes.py): Python functions by the AST, C++/CUDA functions by their
    braces (attributes such as __launch_bounds__ skipped, blocks and lambdas inside a body part of it); an entry of
    the allow-list may not grow, and one that fits its budget now must leave the list."""
    import sizes

    python = "def short():\n    return 1\n\n\nclass A:\n    @staticmethod\n    def long():\n" + "        x = 1\n" * 90
    assert sizes.python_functions(python) == [("short", 2), ("A.long", 92)]
    cxx = ("namespace course {\n// a comment { with a brace\ntemplate <int N>\n__global__ void __launch_bounds__(128)\n"
           "kernel(const float* x,\n       float* y) {\n  if (x) {\n    auto f = [&](int i) { return i; };\n  }\n"
           "  const char* s = \"}\";\n}\nstruct Tile {\n  int size() const { return 4; }\n};\n}  // namespace course\n")
    assert sizes.cxx_functions(cxx) == [("kernel", 9), ("size", 1)]  # from its template line to its brace
    over = {"a.py": 900, "a.py::f": 90}
    assert sizes.problems(over, {"a.py": 900, "a.py::f": 90}) == []
    grew = sizes.problems({"a.py": 901, "a.py::f": 90}, {"a.py": 900, "a.py::f": 90})
    assert len(grew) == 1 and "may only shrink" in grew[0]
    fixed = sizes.problems({"a.py": 900}, {"a.py": 900, "a.py::f": 90})
    assert len(fixed) == 1 and fixed[0].startswith("a.py::f: within its budget now")
    new = sizes.problems({"b.cu::kernel": 81}, {})
    assert len(new) == 1 and "over the function budget of 80: split it" in new[0]
    assert sizes.main([]) == 0, "the repository breaks its own size budgets: see the lines above"
