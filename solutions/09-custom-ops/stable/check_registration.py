"""What the installed stable-ABI wheel registers in the running torch, as JSON on stdout. No GPU needed.

    python check_registration.py SITE     # SITE: the folder the wheel was installed into (pip install --target)

tests/grader09/stable_abi.py runs it under two torch versions with the same wheel and compares the two
reports: the op's schema, the fake kernel's output (shape, dtype, strides, device) under FakeTensorMode
for several shapes in all four dtypes, and the dispatcher's refusal of a CPU tensor. Only the standard
library and torch, in the python that runs it.
"""
import json
import sys

SHAPES = [(1,), (31,), (2, 33), (3, 5, 4097), (0, 8)]
DTYPES = ["float32", "float16", "bfloat16", "float64"]


def main(site: str) -> dict:
    sys.path.insert(0, site)
    import course_stable_ops
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    report = {
        "torch": torch.__version__,
        "library": str(course_stable_ops._LIBRARY),
        "registered": hasattr(torch.ops.course_stable, "bias_gelu"),
        "schema": str(torch.ops.course_stable.bias_gelu.default._schema),
    }
    fake = []
    with FakeTensorMode(allow_non_fake_inputs=False):
        for dtype_name in DTYPES:
            dtype = getattr(torch, dtype_name)
            for shape in SHAPES:
                # A fake CUDA tensor needs no GPU: FakeTensorMode runs the registered fake on meta storage.
                x = torch.empty(shape, dtype=dtype, device="cuda")
                bias = torch.empty(shape[-1], dtype=dtype, device="cuda")
                for approximate in ("none", "tanh"):
                    y = torch.ops.course_stable.bias_gelu(x, bias, approximate)
                    fake.append({"x": list(shape), "dtype": dtype_name, "approximate": approximate,
                                 "shape": list(y.shape), "out_dtype": str(y.dtype).replace("torch.", ""),
                                 "stride": list(y.stride()), "device": str(y.device),
                                 "contiguous": y.is_contiguous()})
    report["fake"] = fake
    try:
        torch.ops.course_stable.bias_gelu(torch.ones(2, 3), torch.ones(3))
        report["cpu_error"] = None
    except (NotImplementedError, RuntimeError) as error:
        report["cpu_error"] = str(error).splitlines()[0]
    return report


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1])))
