"""Every tensor argument's validation, tested one argument at a time (issue 34, class a).

A wrapper that checks x's dtype but forgets weight's passes every test that only feeds it a bad x. So a grader
names each tensor argument of an op and what its wrapper promises to refuse (an `Arg`), and
`assert_each_argument_checked` swaps ONE argument for a bad variant at a time, the others valid: a copy on the CPU,
another dtype, a wrong shape, a non-contiguous view of the same shape, a view that starts off a 16-byte boundary.
Each call must raise an error that says what is wrong and names the argument.

Without a GPU too: under FakeTensorMode (tensors that carry only metadata, device 'cuda' included) a wrapper's
checks read the same sizes, strides, dtypes and devices as on real tensors and raise the same errors. A check
that is missing lets the call run on to its device guard, its allocation or its first data pointer, each of which
raises an error of its own (no driver here; a fake tensor has no data on a GPU machine), which names none of the
words: the test fails either way, before any kernel launch. Alignment is a data pointer's property, so it is
checked on real tensors only (`real=True`, on a GPU).
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from . import calls
from .check import GradeFailure, assert_raises_clearly, dtype_name


@dataclass(frozen=True)
class Arg:
    """One tensor argument of an op and what its wrapper promises to refuse of it.

    dtype: a dtype the wrapper refuses for this argument, the others valid (for an argument whose dtype must match
    another's, any other supported dtype; for the one that sets the dtype, an unsupported one). shape: a function
    of the valid tensor giving one of a wrong shape. strided: a non-contiguous view is refused (False where the
    wrapper accepts, or copies, one). aligned: a view starting one element past a 16-byte boundary is refused.
    words: per check ('device', 'dtype', 'shape', 'strided', 'aligned'), the words its message must contain, where
    they are not the defaults (DEFAULT_WORDS); the argument's name must appear in every message besides."""
    name: str
    dtype: torch.dtype | None = None
    shape: Callable[[torch.Tensor], torch.Tensor] | None = None
    strided: bool = True
    aligned: bool = False
    device: bool = True
    words: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def words_for(self, check: str) -> tuple[str, ...]:
        if check in self.words:
            return self.words[check]
        return tuple(word.format(name=self.name) for word in DEFAULT_WORDS[check])


# What course/torch_op.h's checks say: "x must be a CUDA tensor ...; move it with x.cuda()", "x must have dtype ...",
# "x must be contiguous", "x must start on a 16-byte boundary".
DEFAULT_WORDS = {
    "device": ("CUDA", "{name}.cuda()"),
    "dtype": ("dtype",),
    "shape": ("shape",),
    "strided": ("contiguous",),
    "aligned": ("16-byte",),
}


def strided_view(t: torch.Tensor) -> torch.Tensor:
    """t's values in a view of the same shape that is not contiguous: every other element of a tensor twice as wide
    in the last dimension (last-dimension stride 2, inside its storage: a kernel that ignores the strides reads the
    wrong elements, never out of bounds)."""
    wide = torch.zeros((*t.shape[:-1], 2 * t.shape[-1]), dtype=t.dtype, device=t.device)
    view = wide[..., ::2]
    view.copy_(t)
    return view


def misaligned_view(t: torch.Tensor) -> torch.Tensor:
    """t's values in a contiguous view that starts one element into its storage: 2 or 4 bytes past a 16-byte
    boundary (the allocator's blocks start on one)."""
    storage = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = storage[1:].view(t.shape)
    view.copy_(t)
    return view


def variants(arg: Arg, valid: torch.Tensor, *, real: bool) -> list[tuple[str, torch.Tensor, str]]:
    """(what, the bad tensor, the check it meets) for each refusal `arg` promises; alignment on real tensors only."""
    name = arg.name
    found = []
    if arg.device:
        found.append((f"{name} on the CPU", valid.cpu(), "device"))
    if arg.dtype is not None:
        found.append((f"{name} of dtype {dtype_name(arg.dtype)}", valid.to(arg.dtype), "dtype"))
    if arg.shape is not None:
        bad = arg.shape(valid).contiguous()  # a wrong shape alone: a sliced view would be strided as well
        found.append((f"{name} of shape {list(bad.shape)} (valid: {list(valid.shape)})", bad, "shape"))
    if arg.strided and valid.dim() and valid.shape[-1] > 1:
        found.append((f"{name} a non-contiguous view (last-dimension stride 2)", strided_view(valid), "strided"))
    if arg.aligned and real:
        found.append((f"{name} starting one element past a 16-byte boundary", misaligned_view(valid), "aligned"))
    return found


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    return FakeTensorMode()


@contextlib.contextmanager
def tensors(real: bool):
    """Where the arguments are made and the op called: real CUDA tensors, or fake ones (no GPU needed), with
    harness.calls' input snapshots off for fakes (they copy data, which fakes do not have)."""
    if real:
        yield
        return
    with calls.unchecked(), _fake_mode():
        yield


def _call(call, values):
    """call(*values), with an error of another type (a fake tensor's, say) raised as a RuntimeError that names it:
    assert_raises_clearly then reports what it said instead of the test crashing on it."""
    try:
        return call(*values)
    except (RuntimeError, ValueError, TypeError):
        raise
    except Exception as error:
        raise RuntimeError(f"{type(error).__name__}: {error}") from None


def assert_each_argument_checked(op: str, call, make_args: Callable[[], dict], specs: list[Arg], *,
                                 real: bool) -> None:
    """For each argument in `specs` and each refusal it promises, call `call(*args)` with that one argument
    replaced (the others valid, as make_args() gives them, in call order) and require a clear error: one that
    contains the check's words and the argument's name."""
    with tensors(real):
        args = make_args()
        for arg in specs:
            for what, bad, check in variants(arg, args[arg.name], real=real):
                values = [bad if name == arg.name else value for name, value in args.items()]
                case = f"{op}({what}; every other argument valid)"
                text = assert_raises_clearly(lambda: _call(call, values), must_mention=arg.words_for(check), case=case)
                if not re.search(rf"(?<![\w.]){re.escape(arg.name)}\b", text):
                    raise GradeFailure(f"{case}: raised, but the message does not name {arg.name}; it said:\n    "
                                       f"{text.splitlines()[0][:300]}")
