"""The other readings of an attention whose output misses the oracle, one list for every kind
of check: a causal mask aligned top-left, another scale, the mask read the other way round.

A judge asks :func:`first_fit` which reading explains the output within the 2x rule
(``fits(keep, scale)``, its own comparison): the function checks (:mod:`.judge`) on a case's
arrays, the model check (:mod:`attnkit.check.model.judge`) on what one attention call
received, and the any-model check (:mod:`attnkit.check.model.any_judge`) on an SDPA,
``nn.MultiheadAttention`` or ``flex_attention`` call. A reading that fits names the cause
(``causal-alignment``, ``mask-polarity``, ``causal-leak``, ``padding-ignored``,
``mask-mismatch`` for an ignored window, ``wrong-scale``); none fitting leaves ``inaccurate``.

The readings of a call's mask come in one order, :func:`mask_chain`, with one sentence per
cause, whichever judge finds it: a transformers model knows the causal part, the padding
and the window from its config (:mod:`attnkit.check.model.judge`); a call of SDPA, of
``flex_attention`` or of ``nn.MultiheadAttention`` has them read from the mask it received
(:func:`mask_parts`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalogue import T, Text

__all__ = ["MaskParts", "Reading", "first_fit", "mask_chain", "mask_parts", "named_scales",
           "polarity_reading", "scale_readings", "top_left_reading"]


@dataclass(frozen=True)
class Reading:
    """One other reading: the keep-mask (True = may attend) and scale it computes with
    (None: the call's own), the code it gives and the words of the cause."""

    code: str
    keep: Any = None
    scale: float | None = None
    words: Text | None = None
    detail: dict = field(default_factory=dict)


def scale_readings(Dk: int, Dv: int, expected: float | None = None) -> list[Reading]:
    """Scales people write instead of ``expected`` (default ``1/sqrt(Dk)``): none, ``1/Dk``,
    ``sqrt(Dk)``, ``1/sqrt(Dv)``, and ``1/sqrt(Dk)`` where another scale was asked for."""
    default = 1.0 / math.sqrt(Dk)
    expected = default if expected is None else expected
    out = []
    for scale, words in ((1.0, "scale.none"), (1.0 / Dk, "scale.over-dk"),
                         (math.sqrt(Dk), "scale.times-sqrt-dk"),
                         (1.0 / math.sqrt(Dv), "scale.over-sqrt-dv"),
                         (default, "scale.default")):
        if not math.isclose(scale, expected) and all(
                not math.isclose(scale, r.scale) for r in out):
            out.append(Reading("wrong-scale", scale=scale, words=T(words)))
    return out


def named_scales(Dk: int, Dv: int, scale: float) -> list[Reading]:
    """:func:`scale_readings` of a call that asked for ``scale``, each with the sentence a
    finding prints."""
    return [Reading(r.code, scale=r.scale, words=T("model.scale", scaled=r.words, scale=scale))
            for r in scale_readings(Dk, Dv, scale)]


def top_left_reading(Tq: int, Tk: int, keep: Any = None, torch: Any = None) -> Reading | None:
    """Causal aligned top-left (query ``i`` sees keys ``j <= i``), within ``keep`` when
    given; None when ``Tq == Tk`` (both alignments agree)."""
    if Tq == Tk:
        return None
    tril = (torch.ones(Tq, Tk, dtype=torch.bool).tril() if torch is not None
            else np.tril(np.ones((Tq, Tk), dtype=bool)))
    return Reading("causal-alignment", keep=tril if keep is None else keep & tril,
                   words=T("model.top-left", Tq=Tq, Tk=Tk), detail={"top_left": True})


def polarity_reading(keep: Any, within: Any = None) -> Reading:
    """The mask read the other way round: the keys it excludes are the ones attended
    (within ``within``, a part of the call that is not the mask, e.g. SDPA's ``is_causal``)."""
    alt = ~keep if within is None else within & ~keep
    return Reading("mask-polarity", keep=alt, words=T("model.polarity"))


def first_fit(readings: list[Reading | None],
              fits: Callable[[Any, float | None], bool]) -> Reading | None:
    """The first reading whose output fits the rule, or None."""
    for r in readings:
        if r is not None and fits(r.keep, r.scale):
            return r
    return None


def _wider(code: str, keep: Any, extra: Any, words: Text, **detail: Any) -> Reading | None:
    """``keep | extra`` as a reading, or None when ``extra`` allows no key ``keep`` hides."""
    if extra is None:
        return None
    alt = keep | extra
    return Reading(code, keep=alt, words=words, detail=detail) if bool((alt != keep).any()) \
        else None


def mask_chain(keep: Any, *, top_left: Reading | None = None, polarity: Reading | None = None,
               later: Any = None, padded: Any = None, outside: Any = None,
               window: int | None = None, ignored: Any = None) -> list[Reading | None]:
    """The readings of a call's mask, in the order every judge tries them: causal aligned
    the other way (``top_left``), the mask read the other way round (``polarity``), the
    later keys the mask hides attended (``later``: ``causal-leak``), the padded keys
    attended (``padded``: ``padding-ignored``), the keys beyond the sliding window
    attended (``outside``: ``mask-mismatch``), and last the whole mask ignored
    (``ignored``: the keys allowed then; ``padding-ignored`` where it hides padding, else
    ``causal-leak`` where only later keys, else ``mask-mismatch``). Arrays broadcast
    against ``keep`` (True = may attend); None leaves a reading out."""
    whole = None
    if ignored is not None:
        has = [x is not None and bool(x.any()) for x in (padded, later)]
        code = "padding-ignored" if has[0] else "causal-leak" if has[1] else "mask-mismatch"
        words = {"padding-ignored": T("model.padding-ignored"),
                 "causal-leak": T("model.causal-leak")}.get(code, T("any.mask-ignored"))
        whole = _wider(code, keep, ignored, words)
    return [top_left, polarity,
            _wider("causal-leak", keep, later, T("model.causal-leak")),
            _wider("padding-ignored", keep, padded, T("model.padding-ignored")),
            _wider("mask-mismatch", keep, outside, T("model.window", window=window),
                   window=window),
            whole]


@dataclass(frozen=True)
class MaskParts:
    """A keep-mask ``(..., Tq, Tk)`` read as its parts (each broadcasts against it; None
    where the mask has no such part): ``causal`` the causal structure it follows,
    ``later`` the keys after each query (when causal), ``padded`` the keys of columns
    hidden from every query (padding), ``outside`` the keys further back than a sliding
    window of ``window``."""

    causal: np.ndarray
    later: np.ndarray | None
    padded: np.ndarray | None
    outside: np.ndarray | None
    window: int | None


def mask_parts(keep: np.ndarray, causal: str | None = None) -> MaskParts:
    """Read a keep-mask the call received (True = may attend, ``(..., Tq, Tk)``) as a
    causal structure, padding and a sliding window.

    Args:
        keep: the keys each query may attend.
        causal: ``"top-left"`` or ``"bottom-right"`` when the call itself says the
            alignment (SDPA's ``is_causal`` is top-left); None: bottom-right when the mask
            hides some key after a query and allows none, else no causal part.

    Returns:
        :class:`MaskParts`.
    """
    Tq, Tk = keep.shape[-2:]
    shift = 0 if causal == "top-left" else Tk - Tq
    tri = np.tril(np.ones((Tq, Tk), dtype=bool), shift)
    if causal is None and (~tri).any() and not (keep & ~tri).any():
        causal = "bottom-right"
    if causal is None:
        tri = np.ones((Tq, Tk), dtype=bool)
    later = ~tri if causal is not None and (~tri).any() else None
    column = ~(keep & tri).any(-2, keepdims=True) & tri.any(-2)  # (..., 1, Tk)
    padded = tri & column if column.any() else None
    hidden = tri & ~keep & ~column
    outside, window = None, None
    if causal is not None and hidden.any():
        back = np.arange(Tq)[:, None] + shift - np.arange(Tk)[None, :]  # (Tq, Tk)
        w = int(back[hidden.reshape(-1, Tq, Tk).any(0)].min())
        band = tri & (back >= w) & ~column
        if w > 0 and (band == hidden).all():
            outside, window = band, w
    return MaskParts(tri, later, padded, outside, window)
