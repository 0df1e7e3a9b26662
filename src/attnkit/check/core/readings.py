"""The other readings of an attention whose output misses the oracle, one list for every kind
of check: a causal mask aligned top-left, another scale, the mask read the other way round.

A judge asks :func:`first_fit` which reading explains the output within the 2x rule
(``fits(keep, scale)``, its own comparison): the function checks (:mod:`.judge`) on a case's
arrays, the model check (:mod:`attnkit.check.model.judge`) on what one attention call
received. A reading that fits names the cause (``causal-alignment``, ``wrong-scale``,
``mask-polarity``); none fitting leaves ``inaccurate``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalogue import T, Text

__all__ = ["Reading", "first_fit", "polarity_reading", "scale_readings", "top_left_reading"]


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


def top_left_reading(Tq: int, Tk: int, keep: Any = None, torch: Any = None) -> Reading | None:
    """Causal aligned top-left (query ``i`` sees keys ``j <= i``), within ``keep`` when
    given; None when ``Tq == Tk`` (both alignments agree)."""
    if Tq == Tk:
        return None
    tril = (torch.ones(Tq, Tk, dtype=torch.bool).tril() if torch is not None
            else np.tril(np.ones((Tq, Tk), dtype=bool)))
    return Reading("causal-alignment", keep=tril if keep is None else keep & tril,
                   detail={"top_left": True})


def polarity_reading(keep: Any) -> Reading:
    """The mask read the other way round: the keys it excludes are the ones attended."""
    return Reading("mask-polarity", keep=~keep)


def first_fit(readings: list[Reading | None],
              fits: Callable[[Any, float | None], bool]) -> Reading | None:
    """The first reading whose output fits the rule, or None."""
    for r in readings:
        if r is not None and fits(r.keep, r.scale):
            return r
    return None
