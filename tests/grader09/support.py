"""Lab 09's grader, its helpers: what the nine ops must look like (schemas, outputs), inputs for each op that work on
real and on fake tensors, a dispatch recorder, the float64 references, and the decoder block's golden.

Kept apart from the tests (tests/test_09_custom_ops.py and the parts of this package it imports, which hold the
tests, the mutants and the bars) so that they stay readable. Nothing here builds or grades: the tests ask their LAB
handle for the build and pass the ops in.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from grader09 import schemas
from harness import attention, check, perf
from harness.check import dtype_name, shape_id, tolerance

FP32, FP16, BF16, FP64 = torch.float32, torch.float16, torch.bfloat16, torch.float64
SIXTEEN_BIT = (FP16, BF16)
EPS = 1e-6

# ---------------------------------------------------------------- the ops' contract
# Each op's schema without its namespace, as ops.cpp's TORCH_LIBRARY block defines it (TODO lab09.1): one list for
# every build of the lab (JIT, CMake, wheel), in tests/grader09/schemas.py. The grader compares arguments (names,
# types, defaults, mutation annotations) exactly and results by type.
SCHEMAS = schemas.SCHEMAS
NAMES = tuple(SCHEMAS)
# The differentiable ops: their backward op, and which of their inputs (by position) take a gradient.
BACKWARD_OF = {"bias_gelu": "bias_gelu_backward", "rms_norm": "rms_norm_backward", "softmax": "softmax_backward",
               "flash_attention": "flash_attention_backward"}
DIFFERENTIABLE_INPUTS = {"bias_gelu": (0, 1), "rms_norm": (0, 1), "softmax": (0,), "flash_attention": (0, 1, 2)}
# Outputs the backward does not take a gradient for: ctx.mark_non_differentiable.
NON_DIFFERENTIABLE = {"rms_norm": ("rstd",), "flash_attention": ("lse",)}


def expected_schemas() -> dict[str, str]:
    """Each op's schema text as ops.cpp writes it (without the namespace)."""
    return dict(SCHEMAS)


def _argument(a) -> tuple:
    default = repr(a.default_value) if a.has_default_value() else "-"
    return a.name, str(a.type), default, a.kwarg_only, bool(a.alias_info and a.alias_info.is_write)


def _returns(schema) -> list[tuple]:
    return [(str(r.type), bool(r.alias_info and r.alias_info.is_write)) for r in schema.returns]


def written_arguments(schema) -> list[str]:
    return [a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write]


def schema_problems(actual, expected_text: str, namespace: str) -> list[str]:
    """What differs between the registered schema and the expected one (argument names, types, defaults, the
    mutation annotations; the results' types), in words; [] when they agree."""
    expected = torch._C.parse_schema(f"{namespace}::{expected_text}")
    problems = []
    want_written, got_written = written_arguments(expected), written_arguments(actual)
    if want_written != got_written:
        missing = [n for n in want_written if n not in got_written]
        extra = [n for n in got_written if n not in want_written]
        if missing:
            problems.append(f"it writes {', '.join(missing)}, but the schema does not annotate "
                            f"{'them' if len(missing) > 1 else 'it'} as written: the mutation annotation "
                            f"Tensor(a!) out, Tensor(b!) rstd (one alias set per argument) is missing")
        if extra:
            problems.append(f"{', '.join(extra)} annotated as written (Tensor(a!)), but the op only reads "
                            f"{'them' if len(extra) > 1 else 'it'}")
    got_args, want_args = [_argument(a) for a in actual.arguments], [_argument(a) for a in expected.arguments]
    if [a[:4] for a in got_args] != [a[:4] for a in want_args]:
        problems.append("its arguments differ (names, types or defaults, in order)")
    if _returns(actual) != _returns(expected):
        problems.append(f"it returns {len(actual.returns)} value(s) of type(s) "
                        f"{[str(r.type) for r in actual.returns]}, expected {[str(r.type) for r in expected.returns]}")
    return problems


# ---------------------------------------------------------------- inputs, on real or fake tensors
def randn(shape, dtype, device):
    """N(0, 1) values (on a fake device under FakeTensorMode: metadata only)."""
    return torch.randn(shape, dtype=torch.float32, device=device).to(dtype)


def reference_rstd(x, eps=EPS):
    compute = FP64 if x.dtype == FP64 else FP32
    return torch.rsqrt(x.to(compute).pow(2).mean(-1) + eps)


def reference_attention32(q, k, v, causal, scale):
    """o and lse in float32 from plain PyTorch ops (the lab's conventions: (B, S, H, D), GQA, bottom-right causal):
    consistent inputs for the backward op, on real and on fake tensors alike."""
    batch, seqlen_q, heads_q, head_dim = q.shape
    seqlen_k, group = k.shape[1], heads_q // k.shape[2]
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    qf = q.float().transpose(1, 2)
    kf = k.float().repeat_interleave(group, dim=2).transpose(1, 2)
    vf = v.float().repeat_interleave(group, dim=2).transpose(1, 2)
    s = scale * qf @ kf.transpose(-1, -2)
    if causal:
        rows = torch.arange(seqlen_q, device=q.device).unsqueeze(1)
        cols = torch.arange(seqlen_k, device=q.device).unsqueeze(0)
        s = s.masked_fill(cols > rows + seqlen_k - seqlen_q, float("-inf"))
    lse = torch.logsumexp(s, -1)
    o = (torch.exp(s - lse.unsqueeze(-1)) @ vf).transpose(1, 2)
    return o.to(q.dtype).contiguous(), lse.contiguous()


@dataclass(frozen=True)
class OpCase:
    """One call of one op: `make(device)` gives its arguments (random tensors, on a fake device under
    FakeTensorMode), `what` says them in a failure."""
    op: str
    id: str
    what: str
    make: Callable[[str], tuple]
    dtype: torch.dtype


def _qkv(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, device, layout="contiguous"):
    if layout == "packed":  # slices of one projection output (B, S, Hq + 2 Hkv, D): strided views, as models hold them
        qkv = randn((batch, seqlen_q, heads_q + 2 * heads_kv, head_dim), dtype, device)
        return (qkv[:, :, :heads_q], qkv[:, :, heads_q:heads_q + heads_kv], qkv[:, :, heads_q + heads_kv:])
    if layout == "heads-first":
        # (B, H, S, D) storage seen as (B, S, H, D), as F.scaled_dot_product_attention's callers hold it: dense but
        # not contiguous. torch.empty_like keeps such a layout (the real ops return contiguous outputs): a fake built
        # with it has the wrong strides (issue 34, class c).
        return tuple(randn((batch, h, s, head_dim), dtype, device).transpose(1, 2)
                     for s, h in ((seqlen_q, heads_q), (seqlen_k, heads_kv), (seqlen_k, heads_kv)))
    return (randn((batch, seqlen_q, heads_q, head_dim), dtype, device),
            randn((batch, seqlen_k, heads_kv, head_dim), dtype, device),
            randn((batch, seqlen_k, heads_kv, head_dim), dtype, device))


def _cases() -> list[OpCase]:
    cases = []

    def add(op, ident, what, dtype, make):
        cases.append(OpCase(op, f"{op}-{ident}", f"{op}({what})", make, dtype))

    # The tanh form in float32 and float64, where it differs from the erf form by far more than the tolerance.
    for shape, dtype, form in (((7, 3), FP32, "none"), ((2, 33, 64), FP32, "tanh"), ((5, 8), BF16, "none"),
                               ((4, 16), FP64, "tanh")):
        ident, what = f"{shape_id(shape)}-{dtype_name(dtype)}-{form}", (f"x {list(shape)} {dtype_name(dtype)}, "
                                                                        f"approximate={form!r}")
        add("bias_gelu", ident, what, dtype,
            lambda d, s=shape, t=dtype, f=form: (randn(s, t, d), randn(s[-1:], t, d), f))
        add("bias_gelu_backward", ident, what, dtype,
            lambda d, s=shape, t=dtype, f=form: (randn(s, t, d), randn(s, t, d), randn(s[-1:], t, d), f))
    for shape, dtype in (((7, 33), FP32), ((2, 5, 4096), BF16), ((3, 64), FP64), ((9, 8193), FP16)):
        ident, what = f"{shape_id(shape)}-{dtype_name(dtype)}", f"x {list(shape)} {dtype_name(dtype)}"
        add("rms_norm", ident, what, dtype, lambda d, s=shape, t=dtype: (randn(s, t, d), 1 + 0.1 * randn(s[-1:], t, d),
                                                                          1e-5))
        add("rms_norm_backward", ident, what, dtype, lambda d, s=shape, t=dtype: _rms_backward_args(s, t, d))
        add("softmax", ident, what, dtype, lambda d, s=shape, t=dtype: (randn(s, t, d),))
        add("softmax_backward", ident, what, dtype,
            lambda d, s=shape, t=dtype: (randn(s, t, d), torch.softmax(randn(s, FP32, d), -1).to(t)))
    for shape, dtype in (((7, 33), FP32), ((2, 5, 256), BF16)):
        add("rms_norm_out", f"{shape_id(shape)}-{dtype_name(dtype)}", f"x {list(shape)} {dtype_name(dtype)}", dtype,
            lambda d, s=shape, t=dtype: (randn(s, t, d), 1 + 0.1 * randn(s[-1:], t, d), EPS,
                                         torch.empty(s, dtype=t, device=d),
                                         torch.empty(s[:-1], dtype=FP64 if t == FP64 else FP32, device=d)))
    attention_cases = (
        # (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, dtype, causal, scale, layout)
        (2, 100, 100, 4, 2, 64, BF16, True, None, "contiguous"),
        (1, 77, 130, 2, 2, 128, FP16, False, 0.3, "contiguous"),
        (2, 64, 64, 4, 1, 64, BF16, True, None, "packed"),
        (2, 40, 72, 4, 2, 64, BF16, True, None, "heads-first"),
    )
    layout_words = {"contiguous": "", "packed": ", packed-qkv views",
                    "heads-first": ", (batch, heads, seq, dim) storage"}
    for b, sq, sk, hq, hkv, d, dtype, causal, scale, layout in attention_cases:
        ident = (f"b{b}-{sq}x{sk}-h{hq}-kv{hkv}-d{d}-{dtype_name(dtype)}-{'causal' if causal else 'noncausal'}"
                 + ("" if layout == "contiguous" else f"-{layout}"))
        what = (f"q [{b}, {sq}, {hq}, {d}], k/v [{b}, {sk}, {hkv}, {d}] {dtype_name(dtype)}, causal={causal}"
                + (f", scale={scale}" if scale is not None else "") + layout_words[layout])

        def forward_args(dev, shape=(b, sq, sk, hq, hkv, d), t=dtype, c=causal, sc=scale, lay=layout):
            return (*_qkv(*shape, t, dev, layout=lay), c, sc)

        def backward_args(dev, shape=(b, sq, sk, hq, hkv, d), t=dtype, c=causal, sc=scale, lay=layout):
            q, k, v = _qkv(*shape, t, dev, layout=lay)
            o, lse = reference_attention32(q, k, v, c, sc)
            return randn(q.shape, t, dev), q, k, v, o, lse, c, sc

        add("flash_attention", ident, what, dtype, forward_args)
        if layout != "packed":
            add("flash_attention_backward", ident, what, dtype, backward_args)
    return cases


def _rms_backward_args(shape, dtype, device):
    x = randn(shape, dtype, device)
    return randn(shape, dtype, device), x, 1 + 0.1 * randn(shape[-1:], dtype, device), reference_rstd(x)


CASES = _cases()


def cases_of(*ops: str) -> list[OpCase]:
    return [c for c in CASES if c.op in ops]


# ---------------------------------------------------------------- what each op returns
def expected_outputs(op: str, args: tuple) -> list[tuple[str, tuple, torch.dtype]]:
    """(name, shape, dtype) of each output the op returns, as lessons 06-08's wrappers allocate them: fresh and
    contiguous, on the first input's device. rms_norm_out returns nothing."""
    if op == "bias_gelu":
        x = args[0]
        return [("y", tuple(x.shape), x.dtype)]
    if op == "bias_gelu_backward":
        x = args[1]
        return [("grad_x", tuple(x.shape), x.dtype), ("grad_bias", tuple(x.shape[-1:]), x.dtype)]
    if op == "rms_norm":
        x = args[0]
        return [("y", tuple(x.shape), x.dtype), ("rstd", tuple(x.shape[:-1]), FP64 if x.dtype == FP64 else FP32)]
    if op == "rms_norm_out":
        return []
    if op == "rms_norm_backward":
        x, weight = args[1], args[2]
        return [("grad_x", tuple(x.shape), x.dtype), ("grad_weight", tuple(weight.shape), x.dtype)]
    if op == "softmax":
        return [("y", tuple(args[0].shape), args[0].dtype)]
    if op == "softmax_backward":
        return [("grad_x", tuple(args[1].shape), args[1].dtype)]
    if op == "flash_attention":
        q = args[0]
        batch, seqlen_q, heads_q, _ = q.shape
        return [("o", tuple(q.shape), q.dtype), ("lse", (batch, heads_q, seqlen_q), FP32)]
    if op == "flash_attention_backward":
        q, k, v = args[1:4]
        return [("grad_q", tuple(q.shape), q.dtype), ("grad_k", tuple(k.shape), q.dtype),
                ("grad_v", tuple(v.shape), q.dtype)]
    raise KeyError(op)


OUTPUT_MEANING = {
    ("rms_norm", "rstd"): "one value a row: x.shape[:-1], float32 (float64 for float64 x)",
    ("flash_attention", "lse"): "(batch, heads_q, seqlen_q), float32",
    ("flash_attention", "o"): "q's shape and dtype, contiguous whatever q's strides",
    ("bias_gelu_backward", "grad_bias"): "(C,) = x.shape[-1:], x's dtype",
    ("rms_norm_backward", "grad_weight"): "weight's shape, x's dtype",
}


def as_tuple(result) -> tuple:
    if result is None:
        return ()
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)


def describe_tensor(t) -> str:
    return f"{dtype_name(t.dtype)}{list(t.shape)} strides {list(t.stride())} on {t.device}"


def contiguous_strides(shape) -> tuple:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def output_problems(op: str, args: tuple, result) -> list[str]:
    """Each output against expected_outputs: count, shape, dtype, device (the first tensor input's) and contiguous
    strides."""
    want = expected_outputs(op, args)
    got = as_tuple(result)
    if len(got) != len(want):
        return [f"returned {len(got)} output(s), expected {len(want)} ({', '.join(n for n, _, _ in want) or 'None'})"]
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    problems = []
    for (name, shape, dtype), out in zip(want, got):
        if not isinstance(out, torch.Tensor):
            problems.append(f"{name} is {type(out).__name__}, not a tensor")
            continue
        if tuple(out.shape) != shape or out.dtype != dtype or out.device != device or (
                out.numel() > 1 and out.stride() != contiguous_strides(shape)):
            meaning = OUTPUT_MEANING.get((op, name), "")
            problems.append(f"{name} is {describe_tensor(out)}, expected {dtype_name(dtype)}{list(shape)} strides "
                            f"{list(contiguous_strides(shape))} on {device}" + (f" ({meaning})" if meaning else ""))
    return problems


def metadata_problems(real, fake) -> list[str]:
    """Real outputs against the fake implementation's, one by one: shape, strides, dtype, storage offset."""
    real, fake = as_tuple(real), as_tuple(fake)
    if len(real) != len(fake):
        return [f"the fake implementation returns {len(fake)} output(s), the CUDA kernel {len(real)}"]
    problems = []
    for i, (r, f) in enumerate(zip(real, fake)):
        if (tuple(r.shape), r.stride(), r.dtype, r.storage_offset()) != (tuple(f.shape), f.stride(), f.dtype,
                                                                         f.storage_offset()):
            problems.append(f"output {i}: the CUDA kernel gives {describe_tensor(r)} (storage offset "
                            f"{r.storage_offset()}), the fake {describe_tensor(f)} (storage offset "
                            f"{f.storage_offset()})")
    return problems


# ---------------------------------------------------------------- fake tensors, and what the dispatcher saw
def fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


# Fake tensors on "cuda" need no GPU for the ops themselves, but autograd's engine asks the CUDA driver about the
# device before it runs a backward ("hasPrimaryContext expects a valid device index"). The autograd checks trace on
# fake CPU tensors instead: the formulas do not depend on the device, and the dispatcher routes a fake tensor to
# the fake implementation whatever its device.
AUTOGRAD_FAKE_DEVICE = "cpu"


class OpRecorder(TorchDispatchMode):
    """Records the ops of one namespace that reach the dispatcher below autograd (under FakeTensorMode too): the
    backward of flash_attention must call flash_attention_backward, and not flash_attention again."""

    def __init__(self, namespace: str):
        super().__init__()
        self.namespace = namespace
        self.calls: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith(self.namespace + "::"):
            self.calls.append(name.split("::", 1)[1])
        return func(*args, **(kwargs or {}))


# ---------------------------------------------------------------- float64 references of the ops
def golden(op: str, args: tuple) -> list[torch.Tensor]:
    """The float64 result of each output (for rms_norm_out: out and rstd) of the ops of lessons 06 and 07."""
    d = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    if op == "bias_gelu":
        return [F.gelu(d[0] + d[1], approximate=d[2])]
    if op == "bias_gelu_backward":
        x = d[1].clone().requires_grad_()
        b = d[2].clone().requires_grad_()
        return list(torch.autograd.grad(F.gelu(x + b, approximate=d[3]), (x, b), d[0]))
    if op in ("rms_norm", "rms_norm_out"):
        rstd = torch.rsqrt(d[0].pow(2).mean(-1) + d[2])
        return [d[0] * rstd.unsqueeze(-1) * d[1], rstd]
    if op == "rms_norm_backward":
        x = d[1].clone().requires_grad_()
        w = d[2].clone().requires_grad_()
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w
        return list(torch.autograd.grad(y, (x, w), d[0]))
    if op == "softmax":
        return [torch.softmax(d[0], -1)]
    if op == "softmax_backward":
        grad_y, y = d
        return [y * (grad_y - (grad_y * y).sum(-1, keepdim=True))]
    raise KeyError(f"{op}: attention is checked by check_flash_forward / check_flash_backward")


def reduction_length(op: str, args: tuple) -> int:
    """How many terms an output element sums (for the tolerance): the row for the normalizations, the rows for a
    column sum (grad_bias, grad_weight)."""
    if op in ("bias_gelu",):
        return 1
    if op == "bias_gelu_backward":
        x = args[1]
        return max(1, x.numel() // max(1, x.shape[-1]))
    x = args[0] if op in ("softmax", "rms_norm", "rms_norm_out") else args[1]
    return x.shape[-1] + (x.numel() // max(1, x.shape[-1]) if op == "rms_norm_backward" else 0)


# ---------------------------------------------------------------- checks against the float64 references (GPU)
# The kernels are lessons 06-08's, graded there: here an output only has to show that the binding passes the right
# arguments to the right kernel (approximate, eps, causal, scale, the argument order).
BINDING_HEADROOM = 16.0  # over harness.tolerance


def binding_tol(dtype, n: int) -> float:
    compute = FP64 if dtype == FP64 else FP32
    return tolerance(compute, n) * BINDING_HEADROOM + (tolerance(dtype) if dtype in SIXTEEN_BIT else 0.0)


def gelu_floors(op, args, gold) -> dict:
    """GELU's cancellation (lab 06's docstring): an error of an ulp of 1 times the factors around it, whatever the
    output's size; for grad_bias, a column sum that may cancel, the sum of its terms' sizes."""
    if op == "bias_gelu":
        return {"y": 0.5 * (args[0].double() + args[1].double()).abs()}
    if op == "bias_gelu_backward":
        u = (args[1].double() + args[2].double()).abs()
        cancel = args[0].double().abs() * (0.5 + 0.5 * u + 0.1 * u**3)
        return {"grad_x": cancel, "grad_bias": check.column_sum(gold[0].abs() + cancel)}
    return {}


def check_flash_forward(o, lse, q, k, v, causal, scale, *, case, hint) -> None:
    """o by the flash-attention rule (k = 2) against PyTorch's same-dtype attention, with lab 08's float32 slack on
    the terms' sizes; lse against the float64 golden (2 u of the dtype absolute: l may be summed after P's rounding)."""
    gold = attention.golden(q, k, v, causal, scale)
    n = k.shape[1] + q.shape[3]
    same = attention.same_dtype_attention(q, k, v, causal, scale)
    check.assert_flash_rule(o, gold["o"], same, case=f"{case}: o", k=2.0, hint=hint,
                            slack=tolerance(FP32, n) * gold["o_terms"])
    blind = attention.blind_rows(q.shape[1], k.shape[1], causal)
    got, want = lse.clone(), gold["lse"].clone()
    got[:, :, :blind], want[:, :, :blind] = 0.0, 0.0  # rows that see no key: -inf both, compared as 0
    check.assert_close(got, want, case=f"{case}: lse", hint=hint,
                       tol=tolerance(FP32, n) * 4 + 2 * check.UNIT_ROUNDOFF[q.dtype])


def check_flash_backward(grads, grad_o, q, k, v, o, causal, scale, *, case, hint, names=None) -> None:
    """grad_q, grad_k, grad_v by the flash-attention rule (k = 3), the golden's D from the o the backward was given."""
    gold = attention.golden(q, k, v, causal, scale, grad_o=grad_o, o=o)
    same = attention.same_dtype_backward(grad_o, q, k, v, causal, scale)
    for name, label, got, ref in zip(("grad_q", "grad_k", "grad_v"), names or ("grad_q", "grad_k", "grad_v"), grads,
                                     same):
        n = (k.shape[1] if name == "grad_q" else q.shape[1] * (q.shape[2] // k.shape[2])) + q.shape[3]
        check.assert_flash_rule(got, gold[name], ref if ref is not None else torch.zeros_like(got),
                                case=f"{case}: {label}", k=3.0, hint=hint,
                                slack=tolerance(FP32, n) * gold[name + "_terms"])


def check_against_golden(op: str, args: tuple, outs: tuple, *, case: str, hint: str) -> None:
    """Each output against the op's float64 golden: check.assert_close with BINDING_HEADROOM, and for
    attention the flash-attention rule against PyTorch's same-dtype attention."""
    if op == "flash_attention":
        check_flash_forward(*outs, *args, case=case, hint=hint)
        return
    if op == "flash_attention_backward":
        grad_o, q, k, v, o, _lse, causal, scale = args
        check_flash_backward(outs, grad_o, q, k, v, o, causal, scale, case=case, hint=hint)
        return
    gold = golden(op, args)
    names = [n for n, _, _ in expected_outputs(op, args)] or ["out", "rstd"]
    n = reduction_length(op, args)
    floors = gelu_floors(op, args, gold)
    dtype = args[1].dtype if op.endswith("_backward") else args[0].dtype
    for name, got, want in zip(names, outs, gold):
        check.assert_close(got, want, case=f"{case}: {name}", tol=binding_tol(dtype, n), hint=hint,
                           floor=floors.get(name))


# ---------------------------------------------------------------- the decoder block
@dataclass(frozen=True)
class BlockCase:
    id: str
    hidden: int
    heads: int
    kv_heads: int
    batch: int
    seqlen: int
    dtype: torch.dtype

    def config(self, block_module):
        return block_module.BlockConfig(hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads)

    def describe(self) -> str:
        return (f"DecoderBlock(hidden={self.hidden}, heads={self.heads}, kv_heads={self.kv_heads}, head_dim "
                f"{self.hidden // self.heads}) on x [{self.batch}, {self.seqlen}, {self.hidden}] "
                f"{dtype_name(self.dtype)}")


def double_block(block):
    """A float64 copy of the block: the same (already rounded) parameters, for the golden."""
    return copy.deepcopy(block).to(FP64)


def block_golden(block, x, grad_y, forward_of):
    """float64: the block's output and the gradients of (y * grad_y).sum() for x and every parameter, running
    forward_of(block64, x64) (PyTorch's ops) on a float64 copy of the block."""
    ref = double_block(block)
    return run_block(ref, x.detach().double(), grad_y.double(), lambda t: forward_of(ref, t))


def run_block(block, x, grad_y, forward):
    """(y, {"x": grad of x, parameter name: its grad}) of y = forward(x) and its backward with grad_y, for x and
    every parameter of the block."""
    leaf = x.detach().clone().requires_grad_()
    names = [name for name, _ in block.named_parameters()]
    params = [p for _, p in block.named_parameters()]
    y = forward(leaf)
    grads = torch.autograd.grad(y, [leaf, *params], grad_y)
    return y.detach(), dict(zip(["x", *names], grads))


# ---------------------------------------------------------------- timing the host side of a call
def host_us_per_call(fns: list[Callable], *, calls: int = 2000, rounds: int = 9) -> list[float]:
    """Median microseconds of host time per call of each callable: `calls` calls back to back between two clock
    reads, the callables taking turns round by round (so drift hits all). On a tiny input the GPU runs each kernel
    in less time than the host takes to launch the next, so the host's time per call is the call's overhead: the
    Python binding, the dispatcher, the checks, the allocation and the launch."""
    for fn in fns:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(rounds):
        for fn, timed in zip(fns, times):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            timed.append((time.perf_counter() - start) / calls * 1e6)
    torch.cuda.synchronize()
    return [statistics.median(t) for t in times]


_CUSTOM_OPS: dict[str, object] = {}


def record_overhead(lab_name: str, name: str, ours_us: float, direct_us: float, baseline_name: str,
                    bar_us: float | None, student_us: float | None) -> float:
    """Record a call-overhead case in the bench results (ours and the baseline in ms, the bars as ratios: the
    ratio direct / ours at which the extra time is the bar) and return the extra microseconds."""
    extra = ours_us - direct_us
    ratio_at = (lambda us: direct_us / (direct_us + us)) if bar_us is not None else (lambda us: 0.0)
    case = perf.PerfCase(lab_name, name, baseline_name, ours_us / 1e3, direct_us / 1e3,
                         ratio_at(student_us), ratio_at(bar_us))
    record = asdict(case)
    record.update(gpu=torch.cuda.get_device_name(), extra_us=round(extra, 3), extra_us_target=bar_us,
                  extra_us_student_bar=student_us)
    perf.RESULTS.append(record)
    print(f"{name}: {ours_us:.2f} us a call vs {direct_us:.2f} us ({baseline_name}): {extra:+.2f} us")
    return extra


def pybind_custom_op(lab06, tag: str):
    """A torch.library.custom_op (Python) around lab 06's pybind11 bias_gelu: the other registration style."""
    key = tag
    if key not in _CUSTOM_OPS:
        @torch.library.custom_op(f"course09_{key}_overhead::bias_gelu", mutates_args=())
        def wrapped(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            return lab06.bias_gelu(x, bias, "none", True)

        @wrapped.register_fake
        def _(x, bias):
            return torch.empty_like(x)

        _CUSTOM_OPS[key] = wrapped
    return _CUSTOM_OPS[key]


def sdpa_backend_name(q, k, v) -> str:
    """The backend F.scaled_dot_product_attention picks for TorchOps.attention's call on these (B, S, H, D) tensors
    (causal, GQA), by torch's own selection: its name for the baseline's label."""
    from torch.nn.attention import SDPBackend

    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    try:
        choice = torch._fused_sdp_choice(q, k, v, None, 0.0, True, enable_gqa=q.shape[1] != k.shape[1])
        return SDPBackend(choice).name
    except Exception as error:  # noqa: BLE001 - a label must not fail a timing
        return f"unknown ({type(error).__name__})"
