"""The two masks of one attention call of a model: the one it received, the one it should get.

:func:`received_keep` reads what transformers handed the attention function (a bool mask,
an additive float mask, attnkit's :class:`StructuredMask`, or None with ``is_causal`` and
``sliding_window``) as a bool keep-mask (True = may attend) plus an additive bias.

:func:`expected_keep` builds the mask from the model's facts alone (its config, the padding
of the inputs, which tokens the call's queries and keys are), never from what the
implementation received: causal or bidirectional, sliding window (``q - k < W``, as
transformers counts it), chunked attention (chunks counted from a row's first real token),
padding, and packed documents (position ids that restart). :func:`mask_difference` names
the first query and key where the two disagree, and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..catalogue import T, Text

__all__ = ["CallPlace", "expected_keep", "mask_difference", "received_keep"]


@dataclass
class CallPlace:
    """Which tokens one attention call's queries and keys are (model facts, per call).

    Attributes:
        q_index: ``(Tq,)`` absolute sequence index of each query.
        k_index: ``(Tk,)`` absolute sequence index of each key.
        key_real: ``(B, Tk)`` bool, False at a padded key or an empty cache slot.
        query_real: ``(B, Tq)`` bool, False at a padded query.
        causal: keys after the query are not allowed.
        window: transformers' ``sliding_window`` (``q - k < window``), or None.
        chunk: ``attention_chunk_size`` of chunked attention, or None.
        left_pad: ``(B,)`` left padding of each row (where chunks start counting), or None.
        q_doc: ``(B, Tq)`` packed-document id of each query, or None.
        k_doc: ``(B, Tk)`` packed-document id of each key, or None.
        n_tokens: tokens that exist so far (keys at or past it are empty cache slots).
        structure: ``(B, Tq, Tk)`` bool, the mask the model's own code builds for this
            layer with every token real (:mod:`.facts`), where it differs from what the
            config says; it then replaces ``causal``, ``window``, ``chunk`` and the
            documents. None: the config's facts.
    """

    q_index: torch.Tensor
    k_index: torch.Tensor
    key_real: torch.Tensor
    query_real: torch.Tensor
    causal: bool = True
    window: int | None = None
    chunk: int | None = None
    left_pad: torch.Tensor | None = None
    q_doc: torch.Tensor | None = None
    k_doc: torch.Tensor | None = None
    n_tokens: int = 0
    structure: torch.Tensor | None = None


def expected_keep(place: CallPlace, *, window: bool = True) -> torch.Tensor:
    """``(B, Tq, Tk)`` bool: what the model's config and padding allow (``window=False``:
    the same without the sliding window, to recognise a function that ignores it)."""
    q = place.q_index[:, None]
    k = place.k_index[None, :]
    keep = place.key_real[:, None, :].expand(-1, q.shape[0], -1).clone()
    if place.structure is not None:
        return keep & place.structure
    if place.causal:
        keep &= k <= q
    if window and place.window is not None:
        keep &= (q - k) < place.window
    if place.chunk is not None:
        lp = torch.zeros(keep.shape[0], dtype=torch.long) if place.left_pad is None \
            else place.left_pad
        lp = lp[:, None, None]
        keep &= torch.div(k[None] - lp, place.chunk, rounding_mode="floor") == \
            torch.div(q[None] - lp, place.chunk, rounding_mode="floor")
    if place.q_doc is not None and place.k_doc is not None:
        keep &= place.q_doc[:, :, None] == place.k_doc[:, None, :]
    return keep


def received_keep(mask: Any, module: Any, kwargs: dict, q: torch.Tensor,
                  k: torch.Tensor, top_left: bool = False
                  ) -> tuple[torch.Tensor, torch.Tensor | None, str]:
    """What an attention function received, as ``(keep, bias, words)``.

    ``keep`` is bool ``(B or 1, H or 1, Tq, Tk)``; ``bias`` a float tensor added to the
    scores (T5's ``position_bias``, the finite part of an additive mask) or None; ``words``
    how the mask came (``"bool mask"``, ``"additive float mask"``, ...).

    A mask of None means what transformers means by it: causal when ``is_causal`` (or the
    module's ``is_causal``) and ``Tq > 1``, aligned bottom-right (with ``Tq == Tk``, as
    transformers sends None, both alignments agree), cut to ``sliding_window`` when given.
    ``top_left``: the mask came from transformers' ``sdpa_mask``, which also drops the mask
    of a static cache's prefill (``Tq < Tk``, the keys after the last query empty slots)
    because PyTorch's ``is_causal`` aligns top-left: read it so.
    """
    Tq, Tk = q.shape[-2], k.shape[-2]
    bias = kwargs.get("position_bias")
    bias = None if bias is None else bias.detach()
    if mask is None:
        is_causal = kwargs.get("is_causal")
        is_causal = getattr(module, "is_causal", False) if is_causal is None else is_causal
        keep = torch.ones(Tq, Tk, dtype=torch.bool)
        i = torch.arange(Tq)[:, None] + (0 if top_left else Tk - Tq)
        j = torch.arange(Tk)[None, :]
        words: Text = T("mask.none")
        if is_causal and Tq > 1:
            keep &= j <= i
            words += T("mask.is-causal")
        window = kwargs.get("sliding_window")
        if window is not None:
            keep &= (i - j) < int(window)
            words += T("mask.window", window=window)
        return keep[None, None], bias, words
    dense = getattr(mask, "dense", None)
    if callable(dense) and type(mask).__name__ == "StructuredMask":
        return dense().detach().cpu(), bias, T("mask.structured")
    if type(mask).__name__ == "BlockMask":  # FlexAttention: its mask_mod, element by element
        from torch.nn.attention.flex_attention import create_mask

        keep = create_mask(mask.mask_mod, q.shape[0], 1, Tq, Tk, device=q.device)
        return keep.cpu(), bias, T("mask.block")
    mask = mask.detach().cpu()
    if mask.dtype == torch.bool:
        return mask, bias, T("mask.bool")
    floor = torch.finfo(mask.dtype).min / 2
    keep = mask > floor  # -inf and the dtype's minimum (transformers' fill) mean "masked"
    extra = torch.where(keep, mask, torch.zeros((), dtype=mask.dtype))
    if bool((extra != 0).any()):
        bias = extra if bias is None else bias + extra
    return keep, bias, T("mask.additive")


def _why(place: CallPlace, b: int, i: int, j: int) -> Text:
    """Why key ``j`` is not allowed for query ``i`` of row ``b`` (the first reason)."""
    qi, kj = int(place.q_index[i]), int(place.k_index[j])
    if not bool(place.key_real[b, j]):
        return T("why.empty-slot" if place.n_tokens and kj >= place.n_tokens
                 else "why.padded")
    if place.causal and kj > qi:
        return T("why.future")
    if place.structure is not None:
        return T("why.own-mask")
    if place.window is not None and qi - kj >= place.window:
        return T("why.window", window=place.window)
    if place.chunk is not None:
        return T("why.chunk", chunk=place.chunk)
    if place.q_doc is not None:
        return T("why.document")
    return T("why.other")


def mask_difference(received: torch.Tensor, expected: torch.Tensor,
                    place: CallPlace) -> dict | None:
    """The first disagreement on a real query between ``received`` (``(B|1, H|1, Tq, Tk)``)
    and ``expected`` (``(B, Tq, Tk)``), in query order: ``{"batch", "head", "query", "key",
    "allowed", "why", "count"}`` or None when they agree."""
    B, Tq, Tk = expected.shape
    got = received.expand(B, -1, Tq, Tk)
    want = expected[:, None]
    diff = (got != want) & place.query_real[:, None, :, None]
    if not bool(diff.any()):
        return None
    count = int(diff.any(1).sum())
    idx = diff.nonzero()  # (n, 4): b, h, i, j
    order = (idx[:, 2] * B + idx[:, 0]) * diff.shape[1] * Tk + idx[:, 1] * Tk + idx[:, 3]
    b, h, i, j = (int(x) for x in idx[int(order.argmin())])
    allowed = bool(got[b, h, i, j])
    why = _why(place, b, i, j) if allowed else T("why.real")
    return {"batch": b, "head": h if received.shape[1] > 1 else None, "query": i, "key": j,
            "allowed": allowed, "why": why, "count": count,
            "q_pos": int(place.q_index[i]), "k_pos": int(place.k_index[j])}
