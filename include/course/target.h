// Simulating an older GPU on a newer one. With COURSE_TARGET_ARCH=7.5 (8.0, 8.6, 8.9) the grader builds PTX for
// that compute capability alone, and coursekit/jit.py passes that GPU's limits in COURSE_TARGET_LIMITS
// ("major=7;minor=5;sms=40;shared_per_block_optin=65536;..."); course::device_attribute (cuda.cuh) answers with
// them, so host code dispatches as it would on that GPU and a kernel that asks for more shared memory than that GPU
// has fails here as it would there. No CUDA in this file: tests compile it with a plain C++ compiler.
#pragma once

#include <cstdlib>
#include <string>

namespace course {

struct TargetLimits {
  bool active = false;  // a simulation is on: major and minor replace the GPU's compute capability
  int major = 0;
  int minor = 0;
  // Upper limits on the real GPU's values; 0: not limited.
  int sms = 0;
  int threads_per_sm = 0;
  int blocks_per_sm = 0;
  int shared_per_block_optin = 0;
  int shared_per_sm = 0;
  int l2_bytes = 0;
};

// "key=value;key=value": unknown keys are ignored, a key left out limits nothing. Null or empty text, or text
// without a major, is no simulation.
inline TargetLimits parse_target_limits(const char* text) {
  TargetLimits limits;
  if (text == nullptr) return limits;
  const std::string all(text);
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find(';', start);
    if (end == std::string::npos) end = all.size();
    const std::string item = all.substr(start, end - start);
    const size_t equals = item.find('=');
    if (equals != std::string::npos) {
      const std::string key = item.substr(0, equals);
      const int value = std::atoi(item.c_str() + equals + 1);
      int* field = key == "major"                    ? &limits.major
                   : key == "minor"                  ? &limits.minor
                   : key == "sms"                    ? &limits.sms
                   : key == "threads_per_sm"         ? &limits.threads_per_sm
                   : key == "blocks_per_sm"          ? &limits.blocks_per_sm
                   : key == "shared_per_block_optin" ? &limits.shared_per_block_optin
                   : key == "shared_per_sm"          ? &limits.shared_per_sm
                   : key == "l2_bytes"               ? &limits.l2_bytes
                                                     : nullptr;
      if (field != nullptr) *field = value;
    }
    start = end + 1;
  }
  limits.active = limits.major > 0;
  return limits;
}

// This process's simulation, read from the environment once (the grader sets it before any library loads).
inline const TargetLimits& target_limits() {
  static const TargetLimits limits = parse_target_limits(std::getenv("COURSE_TARGET_LIMITS"));
  return limits;
}

// The lower of a real value and a limit (0: no limit).
inline int capped(int real, int limit) { return limit > 0 && limit < real ? limit : real; }

}  // namespace course
