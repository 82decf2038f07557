// Probe: which TORCH_CHECK message arguments crash on the GPU box (see lesson notes).
#include <course/torch_op.h>
#include <sstream>
void string_only() { TORCH_CHECK(false, "a string ", std::string("and another")); }
void with_int64(int64_t n) { TORCH_CHECK(false, "an int64: ", n); }
void with_to_string(int64_t n) { TORCH_CHECK(false, "to_string: ", std::to_string(n)); }
std::string ostream_int(int64_t n) {
  std::ostringstream s;
  s << n;
  return s.str();
}
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("string_only", &string_only);
  m.def("with_int64", &with_int64);
  m.def("with_to_string", &with_to_string);
  m.def("ostream_int", &ostream_int);
}
