"""transformers' attention masks as attnkit structure instead of a dense matrix.

transformers builds every mask from a *mask function* ``f(b, h, q_idx, kv_idx) -> bool``
composed of small factories (causal, sliding window, packed sequences, ...) plus a 2-D
padding mask, and then evaluates it into a dense ``(B, 1, Tq, Tk)`` tensor. A dense mask
hides what attnkit's fused paths need to know (causal? which diagonal? a window? segments?),
so :func:`mask_function` reads the composition instead:

==============================================  =============================================
transformers piece                              attnkit structure
==============================================  =============================================
``causal_mask_function``                        band ``kpos - qpos <= 0`` (causal)
``bidirectional_mask_function``                 nothing
``sliding_window_overlay(w)``                   band ``kpos - qpos >= 1 - w``
``sliding_window_bidirectional_overlay(w)``     band ``|kpos - qpos| <= w``
``packed_sequence_mask_function(ids)``          ``segment_ids = ids``
``remap_positions_for_packed_sequence(f, p)``   ``f`` (positions step by 1 inside a segment)
``and_masks(...)``                              the AND of the parts
2-D ``attention_mask`` (padding)                ``segment_ids``: key id -1 where padded
==============================================  =============================================

Positions are absolute: query ``i`` sits at ``qpos = q_offset + i``, key ``j`` at ``kpos =
kv_offset + j`` (what a KV cache needs). Anything else (chunked attention, ``or_masks``,
block overlays, user functions) has no structure attnkit can use: it is evaluated densely
by transformers' own ``sdpa_mask`` and passed on as a plain bool tensor.

The structure travels to the attention function inside a :class:`StructuredMask`: a
``torch.Tensor`` of the shape and dtype of the dense mask (so transformers' checks such as
``mask.ndim == 4`` hold) that owns no storage; any torch operation on it (slicing, ``.to``,
arithmetic) evaluates the dense mask first, so code that treats it as a tensor still gets
the right values. Pieces are recognised by the code object of the closure each factory
returns, read once at import: if transformers renames one, that piece falls back to the
dense path (correct, slower), and the integration tests say so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map
from transformers import masking_utils as mu

__all__ = ["StructuredMask", "mask_function"]

# -- reading mask functions ------------------------------------------------------------------


def _code(factory: str, *args: object) -> object | None:
    """The code object of the closure ``masking_utils.<factory>(*args)`` returns, or None
    when this transformers has no such factory."""
    make = getattr(mu, factory, None)
    try:
        return make(*args).__code__ if make is not None else None
    except Exception:  # a changed signature: that piece is read densely
        return None


_AND = _code("and_masks", mu.causal_mask_function)
_WINDOW = _code("sliding_window_overlay", 1)
_WINDOW_BIDIRECTIONAL = _code("sliding_window_bidirectional_overlay", 1)
_PACKED = _code("packed_sequence_mask_function", None)
_REMAP = _code("remap_positions_for_packed_sequence", mu.causal_mask_function, None)


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What a mask function allows: ``lo <= kpos - qpos <= hi`` (None = unbounded), and
    ``segments`` (B, T): equal ids only. ``remapped``: positions were remapped per packed
    sequence, which equals the raw positions only inside a segment."""

    lo: int | None = None
    hi: int | None = None
    segments: torch.Tensor | None = None
    remapped: bool = False


def _cells(fn: Callable) -> dict[str, Any]:
    """The closure variables of ``fn`` by name."""
    cells = {}
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            cells[name] = cell.cell_contents
        except ValueError:  # a cell not filled yet
            pass
    return cells


def _and(a: _Parts, b: _Parts) -> _Parts | None:
    if a.segments is not None and b.segments is not None:
        return None  # two segment tensors: not worth a special case
    lo = b.lo if a.lo is None else a.lo if b.lo is None else max(a.lo, b.lo)
    hi = b.hi if a.hi is None else a.hi if b.hi is None else min(a.hi, b.hi)
    seg = a.segments if a.segments is not None else b.segments
    return _Parts(lo, hi, seg, a.remapped or b.remapped)


def _read(fn: Callable | None) -> _Parts | None:
    """The structure of a transformers mask function, or None if it has none we know."""
    if fn is mu.causal_mask_function:
        return _Parts(hi=0)
    if fn is mu.bidirectional_mask_function:
        return _Parts()
    code = getattr(fn, "__code__", None)
    if code is None:
        return None
    cells = _cells(fn)  # a renamed closure variable reads as None: the dense path
    if code is _AND:
        parts: _Parts | None = _Parts()
        for f in cells.get("mask_functions") or (None,):
            part = _read(f)
            if part is None or parts is None:
                return None
            parts = _and(parts, part)
        return parts
    if code is _WINDOW or code is _WINDOW_BIDIRECTIONAL:
        w = cells.get("sliding_window")
        if not isinstance(w, int) or isinstance(w, bool):
            return None
        # kv_idx > q_idx - w, or |q_idx - kv_idx| <= w
        return _Parts(lo=1 - w) if code is _WINDOW else _Parts(lo=-w, hi=w)
    if code is _PACKED:
        ids = cells.get("packed_sequence_mask")
        return _Parts(segments=ids) if isinstance(ids, torch.Tensor) and ids.ndim == 2 else None
    if code is _REMAP:
        inner = _read(cells.get("mask_function"))
        if inner is None or inner.segments is not None:
            return None
        return dataclasses.replace(inner, remapped=True)
    return None


# -- the structured mask ---------------------------------------------------------------------


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class StructuredMask(torch.Tensor):
    """A ``(B, 1, Tq, Tk)`` bool mask (True = may attend) kept as structure.

    Query ``i`` and key ``j`` sit at absolute positions ``qpos = i + q_offset`` and
    ``kpos = j + kv_offset``; key ``j`` is allowed iff ``lo <= kpos - qpos <= hi`` (None =
    unbounded) and, when ``segment_ids = (q_ids (B, Tq), kv_ids (B, Tk))`` is set, the ids
    are equal and not negative.

    Attributes:
        offset: ``q_offset - kv_offset`` (an int, or a 0-d tensor for a static cache on an
            accelerator, where reading it would cost a host synchronisation).
        lo, hi: the band on ``kpos - qpos``.
        segment_ids: ``(q_ids, kv_ids)`` or None.
    """

    offset: int | torch.Tensor
    lo: int | None
    hi: int | None
    segment_ids: tuple[torch.Tensor, torch.Tensor] | None

    @staticmethod
    def __new__(
        cls,
        batch_size: int,
        q_length: int,
        kv_length: int,
        *,
        offset: int | torch.Tensor = 0,
        lo: int | None = None,
        hi: int | None = None,
        segment_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
        device: torch.device | str = "cpu",
    ) -> StructuredMask:
        shape = (batch_size, 1, q_length, kv_length)
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, shape, dtype=torch.bool, device=torch.device(device)
        )

    def __init__(
        self,
        batch_size: int,
        q_length: int,
        kv_length: int,
        *,
        offset: int | torch.Tensor = 0,
        lo: int | None = None,
        hi: int | None = None,
        segment_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.offset, self.lo, self.hi, self.segment_ids = offset, lo, hi, segment_ids
        self._kwargs: dict[str, Any] | None = None  # attention_kwargs(), once per mask

    def _band(self, Tq: int, Tk: int) -> torch.Tensor | None:
        """``(Tq, Tk)`` bool of the band, or None when it is unbounded."""
        if self.lo is None and self.hi is None:
            return None
        rel = torch.arange(Tk, device=self.device)[None, :] - torch.arange(
            Tq, device=self.device
        )[:, None]
        rel = rel - self.offset  # kpos - qpos
        keep = torch.ones(Tq, Tk, dtype=torch.bool, device=self.device)
        if self.lo is not None:
            keep = keep & (rel >= self.lo)
        if self.hi is not None:
            keep = keep & (rel <= self.hi)
        return keep

    def dense(self) -> torch.Tensor:
        """The mask as a plain bool tensor ``(B, 1, Tq, Tk)`` (what ``sdpa_mask`` builds)."""
        B, _, Tq, Tk = self.shape
        keep = torch.ones(B, 1, Tq, Tk, dtype=torch.bool, device=self.device)
        band = self._band(Tq, Tk)
        if band is not None:
            keep = keep & band
        if self.segment_ids is not None:
            q_ids, kv_ids = self.segment_ids
            same = (q_ids[:, :, None] == kv_ids[:, None, :]) & (q_ids >= 0)[:, :, None]
            keep = keep & same[:, None]
        return keep

    def attention_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`attnkit.torch.attention` that apply this mask.

        attnkit's causal and window bands are aligned to the bottom-right diagonal
        ``diag = i + Tk - Tq``. Here ``kpos - qpos = (j - diag) - delta`` with ``delta =
        offset - (Tk - Tq)``, so the band becomes ``window = (-(lo + delta), hi + delta)``;
        ``hi + delta == 0`` is attnkit's causal, ``hi + offset == 0`` top-left causal.

        Computed once: every layer of one kind shares its mask (a new dict each call, so
        callers may add to it).
        """
        if self._kwargs is None:
            self._kwargs = self._attention_kwargs()
        return dict(self._kwargs)

    def _attention_kwargs(self) -> dict[str, Any]:
        _, _, Tq, Tk = self.shape
        kw: dict[str, Any] = {}
        if self.segment_ids is not None:
            kw["segment_ids"] = self.segment_ids
        if self.lo is None and self.hi is None:
            return kw
        if isinstance(self.offset, torch.Tensor):  # unknown on the host: a (Tq, Tk) band
            kw["mask"] = self._band(Tq, Tk)
            return kw
        delta = self.offset - (Tk - Tq)
        left = None if self.lo is None else -(self.lo + delta)
        right = None if self.hi is None else self.hi + delta
        if right is not None and right == 0:
            kw["causal"], right = True, None
        elif self.hi is not None and self.hi + self.offset == 0:
            kw["causal"], right = "top_left", None
        if left is not None or right is not None:
            kw["window"] = (left, right)
        return kw

    def __repr__(self) -> str:  # never evaluates the dense mask
        seg = "" if self.segment_ids is None else ", segment_ids"
        return (
            f"StructuredMask(shape={tuple(self.shape)}, offset={self.offset}, "
            f"band=[{self.lo}, {self.hi}]{seg})"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        # Any torch operation sees the dense mask: correct values wherever the structure
        # cannot go.
        def dense(x: object) -> object:
            return x.dense() if isinstance(x, StructuredMask) else x

        return func(*tree_map(dense, args), **tree_map(dense, kwargs or {}))


# -- the mask interface ----------------------------------------------------------------------


def mask_function(
    batch_size: int,
    q_length: int,
    kv_length: int,
    q_offset: int | torch.Tensor = 0,
    kv_offset: int = 0,
    mask_function: Callable = mu.causal_mask_function,
    attention_mask: torch.Tensor | None = None,
    device: torch.device | str = "cpu",
    **kwargs: Any,
) -> torch.Tensor:
    """transformers' ``AttentionMaskInterface`` entry: the mask as attnkit structure.

    Args are those transformers passes (see ``masking_utils.sdpa_mask``); ``attention_mask``
    is the 2-D padding mask over absolute positions (True/1 = a real token).

    Returns:
        A :class:`StructuredMask` when every piece of ``mask_function`` is known, else the
        dense bool ``(B, 1, Tq, Tk)`` from ``masking_utils.sdpa_mask``.
    """
    parts = _read(mask_function)
    if parts is not None and parts.remapped and parts.segments is None:
        parts = None  # remapped positions only match raw ones inside packed segments
    if parts is None:
        return mu.sdpa_mask(
            batch_size=batch_size, q_length=q_length, kv_length=kv_length,
            q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
            attention_mask=attention_mask, allow_is_causal_skip=False,
            allow_is_bidirectional_skip=False, use_vmap=kwargs.get("use_vmap", False),
            device=device,
        )
    segment_ids = None
    if parts.segments is not None:
        ids = parts.segments.to(device)
        segment_ids = (ids, ids)
    elif attention_mask is not None:
        kv_valid = _key_validity(attention_mask, kv_length, kv_offset).to(device)
        if _compiling() or not bool(kv_valid.all()):  # no padding: no segments to pass
            kv_ids = kv_valid.to(torch.long) - 1  # 0 for a token, -1 for padding
            q_ids = torch.zeros(batch_size, q_length, dtype=torch.long, device=device)
            # Queries get id 0: the 2-D mask covers the keys, and for cross-attention it
            # says nothing about the queries.
            segment_ids = (q_ids, kv_ids)
    offset: int | torch.Tensor = q_offset - kv_offset
    if isinstance(offset, torch.Tensor) and offset.device.type == "cpu" and not _compiling():
        offset = int(offset)  # free on the CPU (a static cache keeps its length as a tensor)
    return StructuredMask(
        batch_size, q_length, kv_length, offset=offset, lo=parts.lo, hi=parts.hi,
        segment_ids=segment_ids, device=device,
    )


def _key_validity(attention_mask: torch.Tensor, kv_length: int, kv_offset: int) -> torch.Tensor:
    """``(B, Tk)`` bool: key ``j`` (absolute position ``kv_offset + j``) is a real token.
    Positions past the 2-D mask (a static cache's empty slots) are not."""
    valid = attention_mask.to(torch.bool)
    missing = kv_offset + kv_length - valid.shape[-1]
    if missing > 0:
        valid = torch.nn.functional.pad(valid, (0, missing), value=False)
    return valid[:, kv_offset:kv_offset + kv_length]
