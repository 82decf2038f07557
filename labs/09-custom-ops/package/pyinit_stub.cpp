// Lab skeleton generated from solutions/09-custom-ops/package/pyinit_stub.cpp by `./course labs` [lab-hash 0e6a8d14341e].
// Students: fill in the TODO(lab09.k) blocks, then run `./course grade 09`.
// Instructors: edit the solution file instead, then run `./course labs`.
// The wheel's one line of Python: an empty module named course_ops._C, so that `import course_ops._C`
// loads this shared library (ops.cpp and lessons 06-08's wrappers and kernels, linked in beside this file)
// and its TORCH_LIBRARY blocks register torch.ops.course.* as the library's static initializers run.
//
// Why it is needed (the PyInit trap): Python's import dlopens the file, which already registers the ops,
// then looks for PyInit__C, and without one fails with "dynamic module does not define module export
// function (PyInit__C)". The other way out is to not import the library at all: torch.ops.load_library
// on the file's path, as the CMake build (build/cmake/<tree>/libcourse_ops.so) and the stable-ABI wheel
// do. course_ops/__init__.py says why this package imports instead.
//
// Only the limited C API (setup.py builds with py_limited_api, so Py_LIMITED_API is defined): the module
// is created by a call the interpreter exports, so the library links neither libpython nor libtorch_python,
// and one binary serves every CPython from 3.10 on (the wheel's abi3 tag). It still needs the torch it was
// built against: the ops use at::Tensor, whose C++ ABI changes between torch releases.
#include <Python.h>

// PyMODINIT_FUNC is extern "C" and exported: Python looks the function up by its C name.
PyMODINIT_FUNC PyInit__C(void) {
  static struct PyModuleDef module = {
      PyModuleDef_HEAD_INIT,
      "course_ops._C",  // m_name
      nullptr,          // m_doc
      -1,               // m_size: no per-interpreter state
      nullptr,          // m_methods: none, the ops are reached through torch.ops.course
  };
  return PyModule_Create(&module);
}
