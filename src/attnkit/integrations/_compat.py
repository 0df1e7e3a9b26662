"""``attention()`` with the score variants agreed for issue 12, on whichever attnkit is here.

The transformers glue is written against the agreed keywords of
:func:`attnkit.torch.attention`: ``causal`` as ``True``/``"bottom_right"``/``"top_left"``,
``softcap``, ``sinks`` and ``segment_ids``. Until ``attention()`` takes them natively, this
shim expresses each one with what it does take:

- ``causal="top_left"`` with ``Tq != Tk``: the band ``window=(None, Tq - Tk)`` (the
  bottom-right window shifted up to the top-left diagonal), so no dense mask is built;
- ``segment_ids``: a bool ``mask`` ``(B, 1, Tq, Tk)`` (equal ids, neither negative);
- ``softcap`` or ``sinks``: a small math path (scores, softcap, bias, masks, a value-less
  sink column in the softmax, dropout), because no keyword of today's ``attention()``
  can express a ``tanh`` of the scores or an extra term in the denominator.

The choice is made once, at import, from ``inspect.signature(attention).parameters``.
**This module goes away when attention() takes the variants natively**: delete it and
import ``attention`` from :mod:`attnkit.torch` in :mod:`attnkit.integrations.transformers`.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..torch import attention as _attention
from ..torch import safe_softmax

__all__ = ["NATIVE", "attention"]

F = torch.nn.functional

# The agreed keywords; attention() is native when it takes all of them.
_VARIANTS = ("softcap", "sinks", "segment_ids")
NATIVE: bool = all(p in inspect.signature(_attention).parameters for p in _VARIANTS)

SegmentIds = "torch.Tensor | tuple[torch.Tensor, torch.Tensor]"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool | str = False,
    window: tuple[int | None, int | None] | None = None,
    segment_ids: Any = None,
    softcap: float | None = None,
    sinks: torch.Tensor | None = None,
    scale: float | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    need_weights: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`attnkit.torch.attention` with the agreed keywords, native or emulated."""
    if NATIVE:
        return _attention(
            q, k, v, mask=mask, bias=bias, causal=causal, window=window,
            segment_ids=segment_ids, softcap=softcap, sinks=sinks, scale=scale,
            dropout_p=dropout_p, training=training, need_weights=need_weights,
        )
    Tq, Tk = q.shape[-2], k.shape[-2]
    causal, window = _causal_as_band(causal, window, Tq, Tk)
    if segment_ids is not None:
        seg = _segment_mask(segment_ids)
        mask = seg if mask is None else mask & seg
    if softcap is None and sinks is None:
        return _attention(
            q, k, v, mask=mask, bias=bias, causal=causal, window=window, scale=scale,
            dropout_p=dropout_p, training=training, need_weights=need_weights,
        )
    return _math(
        q, k, v, mask=mask, bias=bias, causal=causal, window=window, softcap=softcap,
        sinks=sinks, scale=scale, dropout_p=dropout_p if training else 0.0,
        need_weights=need_weights,
    )


def _causal_as_band(
    causal: bool | str, window: tuple[int | None, int | None] | None, Tq: int, Tk: int
) -> tuple[bool, tuple[int | None, int | None] | None]:
    """``causal`` as today's bottom-right bool plus, for top-left, a band.

    Top-left causal keeps ``j <= i``, i.e. ``j <= (i + Tk - Tq) + (Tq - Tk)``: the
    bottom-right band with ``right = Tq - Tk``. For ``Tq == Tk`` both alignments agree and
    ``causal=True`` keeps attnkit's own fast path.
    """
    if causal in (False, None):
        return False, window
    if causal is True or causal == "bottom_right" or (causal == "top_left" and Tq == Tk):
        return True, window
    if causal != "top_left":
        raise ValueError(f"causal must be a bool, 'bottom_right' or 'top_left', got {causal!r}")
    left, right = (None, None) if window is None else window
    shift = Tq - Tk
    return False, (left, shift if right is None else min(right, shift))


def _segment_mask(segment_ids: Any) -> torch.Tensor:
    """Bool ``(B, 1, Tq, Tk)``: equal ids, and neither is padding (``id < 0``)."""
    q_ids, kv_ids = segment_ids if isinstance(segment_ids, tuple) else (segment_ids,) * 2
    same = q_ids[:, :, None] == kv_ids[:, None, :]  # (B, Tq, Tk)
    return (same & (q_ids >= 0)[:, :, None])[:, None]


def _math(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    causal: bool,
    window: tuple[int | None, int | None] | None,
    softcap: float | None,
    sinks: torch.Tensor | None,
    scale: float | None,
    dropout_p: float,
    need_weights: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Plain attention with softcap and sinks, in the DESIGN.md order: scale, softcap,
    bias, masks; sinks add a value-less column to each softmax denominator."""
    from ..torch import attention_mask

    H, Dk = q.shape[-3], q.shape[-1]
    Tk, G = k.shape[-2], q.shape[-3] // k.shape[-3]
    if G > 1:  # a shim: repeating K/V is fine here
        k, v = k.repeat_interleave(G, dim=-3), v.repeat_interleave(G, dim=-3)
    stat = torch.float32 if q.dtype in (torch.float16, torch.bfloat16) else q.dtype
    s = (q.to(stat) @ k.to(stat).transpose(-1, -2)) * (Dk**-0.5 if scale is None else scale)
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    if bias is not None:
        s = s + bias.to(stat)
    keep = attention_mask(
        tuple(s.shape), mask=mask, causal=causal, window=window, device=q.device
    )
    if sinks is None:
        w = safe_softmax(s, keep)
    else:
        if keep is not None:
            s = s.masked_fill(~keep, float("-inf"))
        sink = sinks.to(stat).reshape(H, 1, 1).expand(*s.shape[:-1], 1)  # (..., H, Tq, 1)
        # The sink is finite, so no row is empty: a row with every key masked puts all its
        # weight on the sink and gets output 0, with no -inf - -inf anywhere.
        w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :Tk]
    dropped = F.dropout(w, dropout_p) if dropout_p > 0.0 else w
    out = dropped.to(v.dtype) @ v
    return out, (w.to(q.dtype) if need_weights else None)
