"""Does Triton's interpreter multiply bfloat16 in ``tl.dot`` correctly?
(docs/testing.md, "Triton versions"; the kernels upcast bf16 operands when
interpreted because it does not.) Prints the largest error of one
16 x 16 bf16 ``tl.dot`` against the float32 product of the same values.

    python scripts/triton_bf16_dot_check.py
"""
import os

os.environ['TRITON_INTERPRET'] = '1'  # before triton is imported
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def _dot16(A, B, C):
    r = tl.arange(0, 16)
    tile = r[:, None] * 16 + r[None, :]
    tl.store(C + tile, tl.dot(tl.load(A + tile), tl.load(B + tile)))


gen = torch.Generator().manual_seed(0)
a, b = (torch.randn(16, 16, generator=gen).bfloat16() for _ in range(2))
c = torch.empty(16, 16)
_dot16[(1, )](a, b, c)
want = a.float() @ b.float()
error = float((c - want).abs().max())
print(f'triton {triton.__version__}: interpreted bf16 tl.dot, max |error| '
      f'{error:.3g} on values up to {float(want.abs().max()):.3g}: '
      + ('WRONG' if error > 1e-3 * float(want.abs().max()) else 'right'))
