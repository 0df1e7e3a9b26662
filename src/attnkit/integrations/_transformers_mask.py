"""transformers' attention masks as attnkit structure instead of a dense matrix.

transformers asks the mask function registered for an ``attn_implementation`` for each
mask a model needs, passing the sizes (``q_length``, ``kv_length``), the positions of the
first query and key (``q_offset``, ``kv_offset``), the 2-D padding mask and a *mask
function* ``f(b, h, q_idx, kv_idx) -> bool`` (causal, bidirectional, sliding window, packed
sequences, or a model's own overlay). Its own flash-attention kernels get only the 2-D
padding mask; attnkit needs a little more (a KV cache may be longer than what it holds),
so :func:`mask_function` returns a :class:`StructuredMask`: the padding, the band the
mask function allows on ``kpos - qpos``, and packed-sequence ids.

The band is read from public facts only, never from a function's code or closure:

- ``causal_mask_function`` and ``bidirectional_mask_function`` are known by identity;
- any other mask function is evaluated once per forward with transformers' public
  ``sdpa_mask`` (no padding), and the band (and, with no cache, packed-sequence ids) is
  read off the result and checked against it exactly. A mask that is not a band, or not a
  band within packed sequences (chunked attention, image-token overlays, a user's own
  function), stays dense: the dense mask goes to attnkit as a plain bool tensor, with a
  warning the first time.

A :class:`StructuredMask` has the shape and dtype of the dense mask (so checks such as
``mask.ndim == 4`` hold) and owns no storage. It means something to attnkit's attention
function only: any torch operation on it raises, naming the operation. A model that uses
the mask itself instead of handing it to ``AttentionInterface`` (T5 before transformers 5.22
adds it to its scores) is refused at its first forward instead of running with a
wrong mask.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch
from transformers import masking_utils as mu

from ..torch._packed import PackedIds

__all__ = ["StructuredMask", "mask_function"]

_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def _compiling() -> bool:
    return torch.compiler.is_compiling()


class StructuredMask(torch.Tensor):
    """A ``(B, 1, Tq, Tk)`` bool mask (True = may attend) kept as structure.

    Query ``i`` and key ``j`` sit at absolute positions ``qpos = i + q_offset`` and
    ``kpos = j + kv_offset``; key ``j`` is allowed iff ``lo <= kpos - qpos <= hi`` (None =
    unbounded), ``key_valid[b, j]`` (when set: the padding), and, when ``segments`` is set,
    query and key lie in the same packed sequence.

    Attributes:
        offset: ``q_offset - kv_offset`` (an int, or a 0-d tensor for a static cache on an
            accelerator, where reading it would cost a host synchronisation).
        lo, hi: the band on ``kpos - qpos``.
        key_valid: ``(B, Tk)`` bool, False at padding; None when nothing is padded.
        segments: ``(B, T)`` packed-sequence ids (queries and keys are the same tokens), or
            None.
    """

    offset: int | torch.Tensor
    lo: int | None
    hi: int | None
    key_valid: torch.Tensor | None
    segments: torch.Tensor | None

    @staticmethod
    def __new__(cls, batch_size: int, q_length: int, kv_length: int, **kwargs: Any):
        shape = (batch_size, 1, q_length, kv_length)
        device = torch.device(kwargs.get("device", "cpu"))
        return torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, shape, dtype=torch.bool, device=device
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
        key_valid: torch.Tensor | None = None,
        segments: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.offset, self.lo, self.hi = offset, lo, hi
        self.key_valid, self.segments = key_valid, segments
        self._kwargs: dict[str, Any] | None = None  # attention_kwargs(), once per mask

    def _band(self) -> torch.Tensor | None:
        """``(Tq, Tk)`` bool of the band, or None when it is unbounded."""
        if self.lo is None and self.hi is None:
            return None
        Tq, Tk = self.shape[-2:]
        rel = _relative(Tq, Tk, self.offset, self.device)
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
        band = self._band()
        if band is not None:
            keep = keep & band
        if self.key_valid is not None:
            keep = keep & self.key_valid[:, None, None, :]
        if self.segments is not None:
            keep = keep & (self.segments[:, :, None] == self.segments[:, None, :])[:, None]
        return keep

    def attention_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of :func:`attnkit.torch.attention` that apply this mask.

        attnkit's causal and window bands are aligned to the bottom-right diagonal
        ``diag = i + Tk - Tq``. Here ``kpos - qpos = (j - diag) - delta`` with ``delta =
        offset - (Tk - Tq)``, so the band becomes ``window = (-(lo + delta), hi + delta)``;
        ``hi + delta == 0`` is attnkit's causal, ``hi + offset == 0`` top-left causal.

        Computed once: every layer of one kind shares its mask (a new dict each call, so
        callers may add to it). Packed sequences come as one
        :class:`attnkit.torch._packed.PackedIds` pair shared by every layer, which finds
        its runs on the first layer's call.
        """
        if self._kwargs is None:
            self._kwargs = self._attention_kwargs()
        return dict(self._kwargs)

    def _attention_kwargs(self) -> dict[str, Any]:
        _, _, Tq, Tk = self.shape
        kw: dict[str, Any] = {}
        if self.segments is not None:
            # One pair for every layer's call: the packed runs are read from it once per
            # mask, not once per layer (attnkit's own object, never transformers' tensor).
            kw["segment_ids"] = PackedIds(self.segments, self.segments)
        if self.key_valid is not None:
            kw["mask"] = self.key_valid[:, None, None, :]  # (B, 1, 1, Tk): keys only
        if self.lo is None and self.hi is None:
            return kw
        if isinstance(self.offset, torch.Tensor):  # unknown on the host: a (Tq, Tk) band
            band = self._band()
            kw["mask"] = band if "mask" not in kw else kw["mask"] & band
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
        extra = "".join(
            f", {name}" for name in ("key_valid", "segments") if getattr(self, name) is not None
        )
        return (
            f"StructuredMask(shape={tuple(self.shape)}, offset={self.offset}, "
            f"band=[{self.lo}, {self.hi}]{extra})"
        )

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):  # noqa: ANN001
        raise RuntimeError(
            f"{func} was applied to attnkit's attention mask. That mask is structure for "
            "attnkit's attention function only, so this model uses its mask outside "
            "transformers' AttentionInterface (T5 before transformers 5.22 adds it to its "
            "scores) and would run with a wrong mask. Use attn_implementation='sdpa' "
            "or 'eager' for this model, or a transformers release where its attention goes "
            "through AttentionInterface; call mask.dense() for the plain bool tensor."
        )


def _relative(Tq: int, Tk: int, offset: int | torch.Tensor, device: torch.device) -> torch.Tensor:
    """``(Tq, Tk)`` of ``kpos - qpos`` for query ``i`` at ``i + offset``, key ``j`` at ``j``."""
    return (torch.arange(Tk, device=device)[None, :] - torch.arange(Tq, device=device)[:, None]
            - offset)


def _read_band(
    dense: torch.Tensor, offset: int
) -> tuple[int | None, int | None, torch.Tensor | None] | None:
    """``(lo, hi, segments)`` of a dense ``(B, 1, Tq, Tk)`` structure mask, checked exactly
    against it, or None when it is not a band (within packed sequences, when ``offset`` is 0
    and ``Tq == Tk``)."""
    D = dense[:, 0]
    _, Tq, Tk = D.shape
    rel = _relative(Tq, Tk, offset, D.device)
    allowed = rel.expand_as(D)[D]
    if allowed.numel() == 0:
        return None
    lo, hi = int(allowed.min()), int(allowed.max())
    band = (rel >= lo) & (rel <= hi)
    lo_, hi_ = (None if lo <= int(rel.min()) else lo), (None if hi >= int(rel.max()) else hi)
    if torch.equal(band.expand_as(D), D):
        return lo_, hi_, None
    if offset != 0 or Tq != Tk or Tq < 2:
        return None
    # Packed sequences: a token starts a new one where it may not see the token before it.
    i = torch.arange(1, Tq, device=D.device)
    starts = ~D[:, i, i - 1]
    segments = torch.cat([torch.zeros_like(starts[:, :1]), starts], 1).long().cumsum(1)
    same = segments[:, :, None] == segments[:, None, :]
    if torch.equal(band & same, D):
        return lo_, hi_, segments
    return None


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
        A :class:`StructuredMask`, or the dense bool ``(B, 1, Tq, Tk)`` from
        ``masking_utils.sdpa_mask`` (with a warning, once) when ``mask_function`` is not a
        band, possibly within packed sequences (chunked attention with no padding is one:
        each chunk reads as a packed sequence).
    """
    offset: int | torch.Tensor = q_offset - kv_offset
    if isinstance(offset, torch.Tensor) and offset.device.type == "cpu" and not _compiling():
        offset = int(offset)  # free on the CPU (a static cache keeps its length as a tensor)
    segments = None
    if mask_function is mu.causal_mask_function:
        lo, hi = None, 0
    elif mask_function is mu.bidirectional_mask_function:
        lo = hi = None
    else:
        read = None
        if not _compiling():
            structure = mu.sdpa_mask(
                batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                attention_mask=None, allow_is_causal_skip=False,
                allow_is_bidirectional_skip=False, use_vmap=kwargs.get("use_vmap", False),
                device=device,
            )
            read = _read_band(structure, int(offset))
        if read is None:
            _warn_once(
                getattr(mask_function, "__qualname__", repr(mask_function)),
                "attnkit: this model's attention mask is not a band (causal, sliding window, "
                "packed sequences), so it goes to attnkit as a dense bool tensor (correct, "
                "without the fused paths' savings).",
            )
            return mu.sdpa_mask(
                batch_size=batch_size, q_length=q_length, kv_length=kv_length,
                q_offset=q_offset, kv_offset=kv_offset, mask_function=mask_function,
                attention_mask=attention_mask, allow_is_causal_skip=False,
                allow_is_bidirectional_skip=False, use_vmap=kwargs.get("use_vmap", False),
                device=device,
            )
        lo, hi, segments = read
    key_valid = None
    if attention_mask is not None:
        valid = _key_validity(attention_mask, kv_length, kv_offset).to(device)
        if _compiling() or not bool(valid.all()):  # no padding: nothing to pass
            key_valid = valid
    return StructuredMask(
        batch_size, q_length, kv_length, offset=offset, lo=lo, hi=hi, key_valid=key_valid,
        segments=segments, device=device,
    )


def _key_validity(attention_mask: torch.Tensor, kv_length: int, kv_offset: int) -> torch.Tensor:
    """``(B, Tk)`` bool: key ``j`` (absolute position ``kv_offset + j``) is a real token.
    Positions past the 2-D mask (a static cache's empty slots) are not."""
    valid = attention_mask.to(torch.bool)
    missing = kv_offset + kv_length - valid.shape[-1]
    if missing > 0:
        valid = torch.nn.functional.pad(valid, (0, missing), value=False)
    return valid[:, kv_offset:kv_offset + kv_length]
