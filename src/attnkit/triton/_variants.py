"""Host side of the attention variants the kernels fuse: segment ids and sinks.

Everything here is torch tensor ops on the caller's device, with no host synchronisation
(nothing is read back to Python), so a call stays capturable by CUDA graphs and
``torch.compile``. The rules these inputs follow (shapes, dtypes) are
:mod:`attnkit.spec`'s.

**Segment ids** (packed documents, padding): query ``i`` may attend key ``j`` only if
``q_ids[b, i] == kv_ids[b, j] >= 0``. The kernels test that per element, and skip whole
blocks that cannot pass it: for each query the host finds the span ``[lo, hi)`` of key
positions holding its id (first to last occurrence; empty for padding or an id no key
has), and each query block loops only over the union of its rows' spans (dK/dV, per key
block, over the mirror spans). For packed documents the union is the block's own
documents, so 8 equal documents cost about 1/8 of the dense work (more when documents are
not contiguous: a span runs from an id's first to its last position).

**Sinks** (one logit per query head, GPT-OSS): a column with no value in each softmax
denominator. The forward kernel starts each row's running max and sum from it, so the LSE
includes it; the dQ/dK/dV kernels are unchanged (``P = exp(s - lse)`` is already
normalised with the sink). The sink's own gradient is
``d_sink[h] = -sum_{b,i} exp(sink[h] - lse[b,h,i]) * (rowsum(dO * O) - dLSE)[b,h,i]``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..spec import check_segment_ids, check_sinks

__all__ = ["Segments", "segment_ids_int32", "segment_spans", "sinks_float32", "sinks_grad"]


class Segments(NamedTuple):
    """Segment ids as the kernels read them: int32, contiguous."""

    q_ids: torch.Tensor  # (B, Tq)
    kv_ids: torch.Tensor  # (B, Tk)

    def batch(self, b: slice) -> Segments:
        """The ids of batch rows ``b`` (launches split along B)."""
        return Segments(self.q_ids[b], self.kv_ids[b])


def segment_ids_int32(
    segment_ids: object, B: int, H: int, Tq: int, Tk: int, device: torch.device
) -> Segments | None:
    """``segment_ids`` (one ``(B, T)`` integer tensor, or a pair ``(q_ids (B, Tq), kv_ids
    (B, Tk))``) checked and made int32 on ``device``; None when not given.

    Ids are compared as int32: values outside ``[-2^31, 2^31)`` wrap.
    """
    if isinstance(segment_ids, Segments):
        return segment_ids
    pair = check_segment_ids(segment_ids, (B, H, Tq, Tk))
    if pair is None:
        return None
    q_ids, kv_ids = (torch.as_tensor(x).to(device=device, dtype=torch.int32).contiguous()
                     for x in pair)
    return Segments(q_ids, kv_ids)


def segment_spans(ids_from: torch.Tensor, ids_to: torch.Tensor) -> tuple[torch.Tensor,
                                                                          torch.Tensor]:
    """For each position ``i`` of ``ids_from`` (B, n), the span ``[lo, hi)`` of positions
    ``j`` of ``ids_to`` (B, m) with ``ids_to[b, j] == ids_from[b, i]``: its first and one
    past its last occurrence; ``(m, 0)`` (empty) for an id < 0 or one ``ids_to`` lacks.

    A stable sort of ``ids_to`` lists each id's positions in increasing order, so the
    first and last of its run (found by binary search) are its first and last occurrence.
    """
    B, m = ids_to.shape
    if m == 0:
        empty = torch.zeros_like(ids_from)
        return empty, empty
    vals, order = torch.sort(ids_to, dim=1, stable=True)
    first = torch.searchsorted(vals, ids_from, right=False)
    stop = torch.searchsorted(vals, ids_from, right=True)
    found = (stop > first) & (ids_from >= 0)
    lo = order.gather(1, first.clamp(max=m - 1))
    hi = order.gather(1, (stop - 1).clamp(min=0)) + 1
    lo = torch.where(found, lo, torch.full_like(lo, m))
    hi = torch.where(found, hi, torch.zeros_like(hi))
    return lo.to(torch.int32).contiguous(), hi.to(torch.int32).contiguous()


def sinks_float32(sinks: object, H: int, device: torch.device) -> torch.Tensor | None:
    """``sinks`` ``(H,)`` checked and made a new float32 tensor on ``device``, or None."""
    if sinks is None:
        return None
    if not isinstance(sinks, torch.Tensor):
        sinks = torch.as_tensor(sinks)
    check_sinks(sinks, H)
    return sinks.detach().to(device=device, dtype=torch.float32).contiguous()


def sinks_grad(
    sinks: torch.Tensor, out: torch.Tensor, dout: torch.Tensor, lse: torch.Tensor,
    dlse: torch.Tensor | None = None,
) -> torch.Tensor:
    """Gradient of the sinks ``(H,)``, in their dtype: ``-sum_{b,i} p_sink * delta`` with
    ``p_sink = exp(sink - lse)`` and ``delta = rowsum(dO * O) - dLSE`` (float32).

    ``out``/``dout`` ``(B, H, Tq, Dv)``, ``lse``/``dlse`` ``(B, H, Tq)``. A sink of
    ``-inf`` takes no mass (gradient 0), never ``exp(-inf + inf)``.
    """
    z = sinks.float()[None, :, None]
    delta = (dout.float() * out.float()).sum(-1)
    if dlse is not None:
        delta = delta - dlse.float()
    live = ~torch.isneginf(z) & ~torch.isneginf(lse)
    p_sink = torch.where(live, torch.exp(z - torch.where(live, lse.float(), 0.0)), 0.0)
    return (-(p_sink * delta).sum((0, 2))).to(sinks.dtype)
