# Sourced by .ci/run: a compiler cache for every compile CI makes (the JIT builds of the
# grader, its mutant and skeleton builds, and the CMake build), kept outside the clone like
# the venv, so a warm machine recompiles only what changed since its last run.
#   - paths below the clone are rewritten relative (CCACHE_BASEDIR), so a fresh clone in a
#     new folder hits the objects of the last one;
#   - a fresh clone's files are all newer than the cache: the mtime/ctime sloppiness lets
#     ccache trust its content hashes instead.
# Without ccache (apt-get failed, say) CI still runs, only slower.
if ! command -v ccache >/dev/null 2>&1; then
  apt-get install -y -qq ccache >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq ccache >/dev/null 2>&1; } || true
fi
if command -v ccache >/dev/null 2>&1 && [ -d /usr/lib/ccache ]; then
  export CCACHE_DIR="${COURSE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}}/gpu-ops-course/ccache"
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=5G
  export CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,locale,time_macros
  export PATH="/usr/lib/ccache:$PATH"                              # c++ -> ccache c++ (JIT builds)
  export PYTORCH_NVCC="ccache ${CUDA_HOME:-/usr/local/cuda}/bin/nvcc"  # torch's cpp_extension honours it
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_CUDA_COMPILER_LAUNCHER=ccache
  ccache --zero-stats >/dev/null
  echo "compiler cache: $CCACHE_DIR"
else
  echo "compiler cache: ccache not available, compiling everything"
fi
