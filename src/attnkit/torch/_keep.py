"""Every mask constraint of one call, kept apart by its structure.

:func:`attnkit.torch.masks.attention_mask` ANDs the constraints into one bool tensor; the
dispatcher needs more than that AND, because what a guard or a kernel costs depends on the
structure (shapes tell it apart, never the values):

- ``keys``: the same for every query (``(..., 1, Tk)``: a key-padding mask, 1-D
  ``valid_lens``, any mask whose query axis is 1). A key it excludes is excluded for
  every query, so zeroing that key row up front is exact.
- ``band``: ``causal`` and ``window``, one band ``(left, right)`` around the bottom-right
  diagonal, known without materialising it.
- ``limits``: 2-D ``valid_lens`` ``(B, Tq)``: query ``i`` sees keys ``j < limit[i]``.
- ``dense``: a mask with a query axis > 1 (any pattern), and ``segment_ids``.

All are bool or int tensors with one axis per score axis (0-D and 1-D masks are
left-padded with ones, so every rank that broadcasts works on every path).
"""

from __future__ import annotations

import torch

from ..spec import check_broadcast, resolve_band
from .masks import segment_mask, valid_lens_limits, window_mask

__all__ = ["Keep", "build_keep", "with_rank"]


class Keep:
    """The constraints of one call on scores of ``shape = (..., Tq, Tk)`` (True = may
    attend). See the module docstring for the four parts; None = part absent."""

    __slots__ = ("shape", "keys", "band", "limits", "dense", "device", "_full", "_rows")

    def __init__(
        self,
        shape: tuple[int, ...],
        *,
        keys: torch.Tensor | None,
        band: tuple[int | None, int | None] | None,
        limits: torch.Tensor | None,
        dense: torch.Tensor | None,
        device: torch.device,
    ) -> None:
        self.shape, self.keys, self.band = shape, keys, band
        self.limits, self.dense, self.device = limits, dense, device
        self._full: torch.Tensor | None = None
        self._rows: torch.Tensor | None = None

    @property
    def only_band(self) -> bool:
        """``causal`` / ``window`` are the only constraints."""
        return self.keys is None and self.limits is None and self.dense is None

    @property
    def only_keys(self) -> bool:
        """A mask shared by every query is the only constraint (padding, 1-D
        ``valid_lens``)."""
        return self.band is None and self.limits is None and self.dense is None

    def keys_differ_by_head(self, G: int) -> bool:
        """A key mask per query head under GQA (``G > 1``): the heads sharing a key/value
        head may attend different keys."""
        keys = self.keys
        return G > 1 and keys is not None and keys.ndim >= 3 and keys.shape[-3] > 1

    @property
    def sdpa_causal(self) -> bool:
        """The one constraint is SDPA's own top-left ``is_causal`` (``j <= i``): causal
        top-left, or bottom-right with ``Tq == Tk``."""
        return self.only_band and self.band == (None, self.shape[-2] - self.shape[-1])

    @property
    def partial(self) -> bool:
        """Some key may be allowed for one query and masked for another (so zeroing whole
        key rows cannot keep its NaN out)."""
        return self.band is not None or self.limits is not None or self.dense is not None

    def band_mask(self) -> torch.Tensor | None:
        """The band as a ``(Tq, Tk)`` bool mask, or None."""
        if self.band is None:
            return None
        Tq, Tk = self.shape[-2], self.shape[-1]
        return window_mask(Tq, Tk, self.band[0], self.band[1], device=self.device)

    def full(self) -> torch.Tensor:
        """The AND of every part, broadcastable to ``shape`` (built once, on first use)."""
        if self._full is None:
            keep: torch.Tensor | None = None
            for part in (self.keys, self.band_mask(), self._limits_mask(), self.dense):
                if part is not None:
                    keep = part if keep is None else keep & part
            assert keep is not None, "a Keep with no part"
            self._full = keep
        return self._full

    def rows(self) -> torch.Tensor | None:
        """``(..., Tq|1, 1)``: queries with at least one allowed key; None when every query
        has one by construction (a causal band whose first query sees key 0)."""
        left, right = self.band if self.band is not None else (0, None)
        if self.only_band and left is None and right is not None \
                and self.shape[-1] - self.shape[-2] + right >= 0:
            return None  # the first query reaches key 0, and every later one does
        if self._rows is None:
            self._rows = self.full().any(dim=-1, keepdim=True)
        return self._rows

    def _limits_mask(self) -> torch.Tensor | None:
        if self.limits is None:
            return None
        return torch.arange(self.shape[-1], device=self.device) < self.limits


def with_rank(x: torch.Tensor, ndim: int) -> torch.Tensor:
    """``x`` viewed with ``ndim`` axes (leading ones added): 0-D and 1-D masks and biases
    then broadcast like any other, whatever rank the kernel insists on."""
    return x if x.ndim == ndim else x.reshape((1,) * (ndim - x.ndim) + tuple(x.shape))


def _check_mask(mask: object, shape: tuple[int, ...]) -> torch.Tensor:
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a bool tensor (True = may attend), got "
            f"{getattr(mask, 'dtype', type(mask))}; pass additive float values as `bias`"
        )
    check_broadcast("mask", tuple(mask.shape), shape)
    return with_rank(mask, len(shape))


def _band(
    causal: object, window: object, Tq: int, Tk: int
) -> tuple[int | None, int | None] | None:
    """``causal`` and ``window`` as one band, or None when it allows every key (e.g.
    bottom-right causal with a single query, which sits at the corner)."""
    left, right = resolve_band(causal, window, Tq, Tk)
    # Row i allows [d - left, d + right], d = i + Tk - Tq: the band is vacuous when the
    # last row reaches back to key 0 and the first row forward to key Tk - 1.
    if (left is None or left >= Tk - 1) and (right is None or right >= Tq - 1):
        return None
    return left, right


def build_keep(
    shape: tuple[int, ...],
    *,
    mask: torch.Tensor | None = None,
    valid_lens: torch.Tensor | None = None,
    causal: bool | str | None = False,
    window: object = None,
    segment_ids: tuple[torch.Tensor, torch.Tensor] | None = None,
    device: torch.device,
) -> Keep | None:
    """Every given constraint for scores of ``shape``, by structure; None when nothing is
    masked. Checks each argument (bool mask broadcastable to ``shape``, ``valid_lens`` of a
    fitting shape and range, a well-formed window); ``segment_ids`` come checked
    (:func:`attnkit.torch._checks.check_segment_ids`)."""
    Tq, Tk = shape[-2], shape[-1]
    keys = dense = limits = None
    for part in (mask, segment_ids):
        if part is None:
            continue
        m = (_check_mask(part, shape) if part is mask else segment_mask(part, shape)).to(device)
        if m.shape[-2] == 1:
            keys = m if keys is None else keys & m
        else:
            dense = m if dense is None else dense & m
    if valid_lens is not None:
        counts = valid_lens_limits(valid_lens, shape).to(device)
        if counts.shape[-2] == 1:  # (B,): one length for every query
            vm = torch.arange(Tk, device=device) < counts
            keys = vm if keys is None else keys & vm
        else:  # (B, Tq): a length per query, kept as the count it is
            limits = counts
    band = _band(causal, window, Tq, Tk)
    if keys is None and dense is None and limits is None and band is None:
        return None
    return Keep(shape, keys=keys, band=band, limits=limits, dense=dense, device=device)
