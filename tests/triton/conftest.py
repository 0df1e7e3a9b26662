"""Shared fixtures for the Triton kernel tests.

Without a CUDA device the kernels run under Triton's interpreter (``TRITON_INTERPRET=1``,
NumPy on the CPU), which must be switched on before any kernel is defined, so it is set
here, before ``attnkit.triton`` is imported by a test. On a GPU the same tests run
compiled, at larger sizes and in half precision as well.

The float64 reference is :func:`attnkit.testing.reference_attention` (``Reference.float64``),
the one every backend's tests use: outputs, LSE and gradients, softcap and ALiBi included.
It is checked against ``attnkit.numpy`` (the oracle) in ``test_flash.py``, and some tests
compare with the oracle directly. The baseline of the 2x/3x/5x rule is plain unfused
PyTorch math run in the kernel's dtype (``Reference.baseline``), never in float64.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import pytest
import torch

from attnkit.testing import ReferenceResult, reference_attention

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ.setdefault("TRITON_INTERPRET", "1")

pytest.importorskip("triton", reason="attnkit.triton needs the triton package")

DEVICE = "cuda" if ON_GPU else "cpu"


@dataclass(frozen=True)
class Case:
    """One attention problem; the fields mirror ``flash_attention``'s arguments."""

    B: int = 1
    H: int = 2
    Hkv: int = 2
    Tq: int = 17
    Tk: int = 17
    Dk: int = 32
    Dv: int | None = None
    causal: bool = False
    window: tuple[int | None, int | None] | None = None
    scale: float | None = None
    softcap: float | None = None
    alibi: str | None = None  # None, "h" for (H,) slopes, "bh" for (B, H)

    @property
    def dv(self) -> int:
        return self.Dk if self.Dv is None else self.Dv

    def options(self, slopes: torch.Tensor | None) -> dict:
        return dict(causal=self.causal, window=self.window, scale=self.scale,
                    softcap=self.softcap, alibi_slopes=slopes)


class Reference:
    """The float64 reference, and the plain same-dtype baseline of the 2x/3x/5x rule."""

    @staticmethod
    def float64(q, k, v, *, dout=None, dlse=None, **options) -> ReferenceResult:
        """``attnkit.testing.reference_attention`` (float64 NumPy): out, lse, and dq, dk, dv
        for the loss ``<out, dout> + <lse, dlse>`` when ``dout`` is given."""
        return reference_attention(q, k, v, d_out=dout, d_lse=dlse, **options)

    @staticmethod
    def keep(Tq: int, Tk: int, causal: bool, window, device) -> torch.Tensor:
        i = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)  # diagonal key of query i
        j = torch.arange(Tk, device=device)[None, :]
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
        left, right = (None, None) if window is None else window
        if causal:
            right = 0 if right is None else min(right, 0)
        if left is not None:
            keep &= j >= i - left
        if right is not None:
            keep &= j <= i + right
        return keep

    @staticmethod
    def baseline(q, k, v, *, causal=False, window=None, scale=None, softcap=None,
                 alibi_slopes=None):
        """Plain (unfused) attention in the inputs' dtype, autograd-friendly: ``(out, lse)``;
        fully masked rows give 0 and -inf with finite gradients."""
        B, H, Tq, Dk = q.shape
        Hkv, Tk = k.shape[1], k.shape[2]
        G = H // Hkv
        k = k.repeat_interleave(G, dim=1)
        v = v.repeat_interleave(G, dim=1)
        scale = 1.0 / math.sqrt(Dk) if scale is None else scale
        s = (q @ k.transpose(-1, -2)) * scale
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        if alibi_slopes is not None:
            i = torch.arange(Tq, device=q.device)[:, None] + (Tk - Tq)
            j = torch.arange(Tk, device=q.device)[None, :]
            dist = (i - j).abs().to(s.dtype)
            slopes = alibi_slopes.to(s.dtype).expand(B, H)
            s = s - slopes[:, :, None, None] * dist
        keep = Reference.keep(Tq, Tk, causal, window, q.device)
        any_row = keep.any(-1)[:, None]  # (Tq, 1)
        # Rows with no key: softmax over zeros, then zeroed, so no NaN reaches autograd.
        s = torch.where(keep, s, float("-inf"))
        s = torch.where(any_row, s, torch.zeros((), dtype=s.dtype, device=s.device))
        p = torch.where(keep, torch.softmax(s, dim=-1), torch.zeros((), dtype=s.dtype,
                                                                    device=s.device))
        out = p @ v
        lse = torch.logsumexp(s, dim=-1)
        lse = torch.where(any_row[:, 0], lse, torch.full((), float("-inf"), dtype=lse.dtype,
                                                          device=lse.device))
        return out, lse


@pytest.fixture(scope="session")
def at():
    """``attnkit.triton``, imported on first use rather than at collection, so that test
    folders collected earlier run without the kernels (and the interpreter) loaded."""
    import attnkit.triton

    return attnkit.triton


@pytest.fixture
def reference() -> type[Reference]:
    return Reference


@pytest.fixture
def device() -> str:
    return DEVICE


def make_inputs(case: Case, dtype: torch.dtype, seed: int = 0):
    """Random q, k, v (requires_grad), slopes, dout and dlse for ``case``."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q = rnd(case.B, case.H, case.Tq, case.Dk)
    k = rnd(case.B, case.Hkv, case.Tk, case.Dk)
    v = rnd(case.B, case.Hkv, case.Tk, case.dv)
    slopes = None
    if case.alibi == "h":
        slopes = torch.tensor([2.0 ** (-8 * (h + 1) / case.H) for h in range(case.H)])
    elif case.alibi == "bh":
        slopes = torch.rand(case.B, case.H, generator=g, dtype=torch.float64) * 0.5
    dout = rnd(case.B, case.H, case.Tq, case.dv)
    dlse = rnd(case.B, case.H, case.Tq)
    to = dict(device=DEVICE, dtype=dtype)
    q, k, v, dout = (x.to(**to) for x in (q, k, v, dout))
    slopes = None if slopes is None else slopes.to(device=DEVICE, dtype=torch.float32)
    return q, k, v, slopes, dout, dlse.to(DEVICE, torch.float32)


@pytest.fixture
def inputs():
    return make_inputs


@pytest.fixture
def case_type() -> type[Case]:
    return Case
