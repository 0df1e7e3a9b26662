"""Heads split without the transpose, read from the captured projections: a module that
views a projection's ``(B, T, E)`` output straight as ``(B, H, T, d)`` (``view(B, H, T, d)``
where ``view(B, T, H, d).transpose(1, 2)`` belongs) computes a correct attention over rows
that are pieces of several tokens. The reading that splits so, merged back either way
(``transpose(1, 2).reshape`` or a straight ``reshape``), is computed with the float64 oracle
core; a finding needs it to explain the output projection's input under the 2x rule, as
every reading of the oracle does.

And the reproducer of a ``mixes-queries`` found by the oracle: for a self-attention module
that is not causal and has nothing position-dependent (the reading explains it from its
projections alone), permuting the tokens must permute the outputs; elsewhere, the core
from its own q, k, v (:func:`~attnkit.check.multihead.oracle_repro.core_repro`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..catalogue import Text
from ..core.repro import note, said
from .oracle_probes import positional
from .oracle_repro import core_repro
from .reference import core, oracle_core, passes
from .structure import Candidate, Capture

__all__ = ["mixing_repro", "split_without_transpose"]


def _split_flat(cand: Candidate, P: dict[int, np.ndarray]) -> list[np.ndarray]:
    """q, k, v as ``p[..., cols].reshape(B, n, T, dim)``: the memory of ``(B, T, n * dim)``
    read as heads without the transpose."""
    out = []
    for (i, first, width), n, dim in zip(cand.parts, (cand.H, cand.Hkv, cand.Hkv),
                                         (cand.d, cand.d, cand.dv)):
        p = P[i][:, :, first:first + width]
        out.append(np.ascontiguousarray(p).reshape(p.shape[0], n, p.shape[1], dim))
    return out


def split_without_transpose(got: np.ndarray, P: dict[int, np.ndarray], cands: list[Candidate],
                            keeps: list[tuple[bool, np.ndarray]]) -> tuple[Candidate, bool] | None:
    """The reading (and whether causal) whose heads, split without the transpose, explain
    the merged core ``got`` ``(B, T, H * dv)`` from the projections' outputs ``P``; None
    when none does (so a module split right, or wrong some other way, is never named)."""
    for cand in cands:
        if cand.interleave or cand.cycle or cand.layout != "hd" or cand.H == 1:
            continue
        if got.shape[-1] != cand.H * cand.dv:
            continue
        q, k, v = _split_flat(cand, P)
        if q.shape[2] != got.shape[1] or k.shape[2] != v.shape[2]:
            continue
        for causal, keep in keeps:
            if keep.shape != (q.shape[2], k.shape[2]):
                continue
            ref = oracle_core(q, k, v, keep)
            base = core(q, k, v, keep, 1 / math.sqrt(cand.d), dtype=np.float32)
            for merged in ((cand.merge(ref), cand.merge(base)),
                           (ref.reshape(got.shape), base.reshape(got.shape))):
                if passes(got, *merged, "split") is None:
                    return cand, causal
    return None


def mixing_repro(h: Any, m: Any, cap: Capture, cand: Candidate, o_index: int | None,
                 causal: bool) -> Text:
    """The reproducer of heads split or merged without the transpose."""
    if h.self_only and not causal and positional(h, m, cap):
        perm = [3, 0, 4, 1, 2][:cap.xq.shape[1]]
        return h.repro([
            note(f"perm = torch.tensor({perm})", "repro.permuted"),
            "with torch.no_grad():",
            "    a, b = run(x), run(x[:, perm])",
            "assert torch.allclose(b, a[:, perm], atol=1e-5), "
            + said("repro.split-no-transpose")])
    return core_repro(h, cap, cand, o_index, causal)
