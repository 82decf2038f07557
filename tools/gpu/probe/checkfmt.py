import subprocess
import sys

from torch.utils.cpp_extension import load

m = load(name="checkfmt", sources=["tools/gpu/probe/checkfmt.cpp"], extra_include_paths=["include"],
         build_directory="/tmp", with_cuda=True)
if len(sys.argv) > 1:
    fn = getattr(m, sys.argv[1])
    try:
        print(sys.argv[1], "->", fn(5) if sys.argv[1] != "string_only" else fn())
    except RuntimeError as e:
        print(sys.argv[1], "-> RuntimeError:", str(e).splitlines()[0])
    sys.exit(0)
maps = [line.split()[-1] for line in open("/proc/self/maps") if "stdc++" in line]
print("libstdc++ mapped:", sorted(set(maps)))
for name in ("string_only", "with_to_string", "ostream_int", "with_int64"):
    r = subprocess.run([sys.executable, __file__, name], capture_output=True, text=True)
    print(name, "exit", r.returncode, r.stdout.strip()[-200:])
