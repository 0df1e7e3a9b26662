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

from attnkit.spec import resolve_band
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
    causal: bool | str = False
    window: tuple[int | None, int | None] | None = None
    scale: float | None = None
    softcap: float | None = None
    alibi: str | None = None  # None, "h" for (H,) slopes, "bh" for (B, H)
    sinks: bool = False  # one random logit per query head
    segments: str | None = None  # None, or a layout of make_segment_ids

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
    def keep(Tq: int, Tk: int, causal: bool | str, window, device) -> torch.Tensor:
        i = torch.arange(Tq, device=device)[:, None] + (Tk - Tq)  # diagonal key of query i
        j = torch.arange(Tk, device=device)[None, :]
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=device)
        left, right = resolve_band(causal, window, Tq, Tk)
        if left is not None:
            keep &= j >= i - left
        if right is not None:
            keep &= j <= i + right
        return keep

    @staticmethod
    def baseline(q, k, v, *, causal=False, window=None, scale=None, softcap=None,
                 alibi_slopes=None, sinks=None, segment_ids=None):
        """Plain (unfused) attention in the inputs' dtype, autograd-friendly: ``(out, lse)``;
        fully masked rows give 0 and -inf (the sink with sinks) with finite gradients."""
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
        if segment_ids is not None:
            q_ids, kv_ids = (segment_ids if isinstance(segment_ids, tuple)
                             else (segment_ids, segment_ids))
            qi, kj = q_ids.to(q.device)[:, :, None], kv_ids.to(q.device)[:, None, :]
            keep = keep & ((qi == kj) & (qi >= 0))[:, None]  # (B, 1, Tq, Tk)
        zero = torch.zeros((), dtype=s.dtype, device=s.device)
        s = torch.where(keep, s, float("-inf"))
        if sinks is not None:  # one more column, with no value
            z = sinks.to(s.dtype)[None, :, None, None].expand(B, H, Tq, 1)
            s = torch.cat([s, z], dim=-1)
            keep = torch.cat([keep.expand(B, H, Tq, Tk),
                              torch.ones(B, H, Tq, 1, dtype=torch.bool, device=q.device)], -1)
        any_row = keep.any(-1, keepdim=True)
        # Rows with no key: softmax over zeros, then zeroed, so no NaN reaches autograd.
        s = torch.where(any_row, s, zero)
        p = torch.where(keep, torch.softmax(s, dim=-1), zero)
        lse = torch.logsumexp(s, dim=-1)
        lse = torch.where(any_row[..., 0], lse, torch.full((), float("-inf"), dtype=lse.dtype,
                                                           device=lse.device))
        out = p[..., :Tk] @ v
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


def make_segment_ids(layout: str, B: int, Tq: int, Tk: int, seed: int = 0):
    """Segment ids for the tests: ``"packed"`` (self-attention, ``Tq == Tk``: documents of
    random lengths, padding (-1) at the end of row 0 and the start of row 1), ``"pair"``
    (queries and keys with ids of their own, a query id no key has), ``"interleaved"``
    (ids that alternate in runs of 3: every segment is scattered)."""
    g = torch.Generator().manual_seed(seed)
    if layout == "interleaved":
        ids = (torch.arange(Tk) // 3) % 2
        return ids.expand(B, Tk).contiguous()
    if layout == "pair":
        q_ids = torch.sort(torch.randint(0, 4, (B, Tq), generator=g), dim=1).values
        kv_ids = torch.sort(torch.randint(0, 3, (B, Tk), generator=g), dim=1).values
        return q_ids, kv_ids  # queries of id 3 see no key
    assert layout == "packed" and Tq == Tk
    ids = torch.empty(B, Tk, dtype=torch.int64)
    for b in range(B):
        cuts = torch.sort(torch.randperm(Tk - 1, generator=g)[:3] + 1).values.tolist()
        doc = torch.zeros(Tk, dtype=torch.int64)
        for c in cuts:
            doc[c:] += 1
        ids[b] = doc
    ids[0, -5:] = -1  # right padding
    ids[-1, :4] = -1  # left padding (of the same row when B = 1)
    return ids


def variant_inputs(case: Case, seed: int = 0):
    """``(sinks (H,) float32 or None, segment_ids or None)`` for ``case``, on DEVICE."""
    g = torch.Generator().manual_seed(seed + 7)
    sinks = None
    if case.sinks:
        sinks = (torch.randn(case.H, generator=g) * 2.0).to(DEVICE, torch.float32)
    seg = None
    if case.segments is not None:
        seg = make_segment_ids(case.segments, case.B, case.Tq, case.Tk, seed)
        seg = tuple(x.to(DEVICE) for x in seg) if isinstance(seg, tuple) else seg.to(DEVICE)
    return sinks, seg


@pytest.fixture
def inputs():
    return make_inputs


@pytest.fixture
def case_type() -> type[Case]:
    return Case


@pytest.fixture
def variants():
    """``variant_inputs``: the sinks and segment ids of a :class:`Case`."""
    return variant_inputs


@pytest.fixture
def segment_ids():
    """``make_segment_ids``: segment ids of a named layout."""
    return make_segment_ids
