# Lab skeleton generated from solutions/05-tensor-cores/_tune.py by `./course labs` [lab-hash 7b1a5e20d2c9].
# Students: fill in the TODO(lab05.k) blocks, then run `./course grade 05`.
# Instructors: edit the solution file instead, then run `./course labs`.
import os, re, shutil, sys, time, statistics
import torch, torch.nn.functional as F
from torch.utils.cpp_extension import load
ROOT = os.getcwd(); SRC = f"{ROOT}/solutions/05-tensor-cores"
os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "9.0")
B64 = {"kBlockK = 32": "kBlockK = 64"}
VARIANTS = {
  "bk32-s4-128x128": {},
  "bk64-s3-128x128": {**B64, "kStagesAsync = 4": "kStagesAsync = 3"},
  "bk64-s3-128x256": {**B64, "kStagesAsync = 4": "kStagesAsync = 3", "kBlockN = 128": "kBlockN = 256", "kMinBlocksPerSm = 2": "kMinBlocksPerSm = 1"},
  "bk64-s4-128x256": {**B64, "kBlockN = 128": "kBlockN = 256", "kMinBlocksPerSm = 2": "kMinBlocksPerSm = 1"},
  "bk32-s6-128x256": {"kStagesAsync = 4": "kStagesAsync = 6", "kBlockN = 128": "kBlockN = 256", "kMinBlocksPerSm = 2": "kMinBlocksPerSm = 1"},
}
def ms(fn, reps=30):
    for _ in range(3): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record(); fn(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    return statistics.median(ts)
M = N = K = 4096
x = torch.randn(M, K, device="cuda").bfloat16(); w = (torch.randn(N, K, device="cuda") / 64).bfloat16(); b = torch.randn(N, device="cuda").bfloat16()
ref = F.gelu(x.double() @ w.double().t() + b.double(), approximate="tanh")
tf = lambda t: 2 * M * N * K / (t * 1e-3) / 1e12
for name, fn in [("matmul", lambda: torch.matmul(x, w.t())), ("gelu(addmm)", lambda: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")),
                 ("_addmm_activation gelu", lambda: torch._addmm_activation(b, x, w.t(), use_gelu=True)),
                 ("gelu alone", lambda: F.gelu(ref.bfloat16(), approximate="tanh"))]:
    t = ms(fn); print(f"{name:28s} {t:.4f} ms {tf(t):7.1f} TFLOP/s", flush=True)
for v, subs in VARIANTS.items():
    d = f"/tmp/v_{v}"; shutil.rmtree(d, ignore_errors=True); shutil.copytree(SRC, d)
    p = f"{d}/linear_act.cu"; s = open(p).read()
    for a, c in subs.items(): assert a in s, a; s = s.replace(a, c)
    open(p, "w").write(s)
    os.makedirs(f"/tmp/b_{v}", exist_ok=True); t0 = time.time()
    try:
        mod = load(name=f"tune_{v}", sources=[p, f"{d}/wrapper.cpp"], extra_include_paths=[f"{ROOT}/include", d],
                   extra_cflags=["-O3", "-std=c++17"], extra_cuda_cflags=["-O3", "-std=c++17", "-lineinfo", "-Xptxas=-v"],
                   build_directory=f"/tmp/b_{v}", verbose=False)
    except Exception as e:
        print(v, "BUILD FAILED", str(e)[-1500:]); continue
    for (m2, n2, k2) in [(129, 264, 520), (1000, 1000, 1000)]:
        xs, ws, bs = x[:m2, :k2].contiguous(), w[:n2, :k2].contiguous(), b[:n2].contiguous()
        r2 = F.gelu(xs.double() @ ws.double().t() + bs.double(), approximate="tanh")
        e2 = ((mod.linear_act(xs, ws, bs, "gelu").double() - r2).norm() / r2.norm()).item()
        print(f"   {v} {m2}x{n2}x{k2} relerr {e2:.2e}")
    out = mod.linear_act(x, w, b, "gelu")
    err = ((out.double() - ref).norm() / ref.norm()).item()
    t = ms(lambda: mod.linear_act(x, w, b, "gelu"))
    print(f"{v:28s} {t:.4f} ms {tf(t):7.1f} TFLOP/s relerr {err:.2e} (build {time.time()-t0:.0f} s)", flush=True)
