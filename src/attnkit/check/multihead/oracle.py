"""``check_multi_head`` against the float64 oracle, computed from the module's own weights.

The structure comes from one forward with hooks (:mod:`attnkit.check.multihead.structure`). Two
comparisons follow, each under the 2x rule of the function check:

- the attention core: the oracle's ``softmax(q k^T / sqrt(d)) v`` on the q, k, v the
  module's projections produced (captured), against the input of its output projection;
- the whole output: the oracle from the module's input and a float64 copy of its weights,
  against its output.

So a report can say whether an error is in the attention or around it. An error is named
when another reading fits under the same rule (:func:`explain`): a scale (named: no scale,
``1/sqrt(E)``, ``1/d``, ``sqrt(d)``, else the fitted value, and, when the module can be
built at a second head dim, "at every head dim"), the softmax over the queries axis,
weights that do not sum to 1 (a sigmoid), another head count. Tokens of one batch example
that move another's output are ``mixes-queries``. Where the module runs something the
check cannot read between its projections and its scores (a norm, rotary embeddings,
scores that depend on positions), nothing is claimed: the report says "not compared with the
oracle" and why, and the property probes are all there is.
"""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import torch

from ..core.report import Finding
from .inner import compare_inner
from .oracle_probes import (
    batch_mixing,
    extra_parameters,
    linear_in_v,
    positional,
    tokens_alone,
)
from .oracle_repro import batch_mixing_repro, core_repro
from .oracle_words import say
from .reference import core, diagonal_masked, fit_scale, linear, oracle_core, passes
from .roles import misread_inputs
from .split_reading import mixing_repro, split_without_transpose
from .structure import (
    Candidate,
    Capture,
    Outcome,
    batch_first,
    candidates,
    capture,
    heads_of,
    output_projection,
)

__all__ = ["Outcome", "compare_with_oracle"]

B, T = 2, 5


def _rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().double().numpy()


def _keeps(T_: int, causal: bool | None) -> list[tuple[bool, np.ndarray]]:
    """The keep-masks of the comparison: causal for a module that behaves causal (the
    causality probe), every key for one that does not, both where it was not probed."""
    full = np.ones((T_, T_), dtype=bool)
    pairs = [(False, full), (True, np.tril(full))]
    return pairs if causal is None else [pairs[int(bool(causal))]]


class Reading:
    """The captured tensors of one forward, in float64, for judging candidates."""

    def __init__(self, cap: Capture, merged: torch.Tensor, o: Any) -> None:
        self.cap, self.o = cap, o
        Bn, Tq = cap.xq.shape[:2]
        Tk = cap.xkv.shape[1]
        self.P: dict[int, np.ndarray] = {}
        self.P64: dict[int, np.ndarray] = {}
        self.P32: dict[int, np.ndarray] = {}
        for i, c in enumerate(cap.linears):
            out = batch_first(c.out, Bn, Tq) if batch_first(c.out, Bn, Tq) is not None \
                else batch_first(c.out, Bn, Tk)
            x = batch_first(c.args[0], *out.shape[:2]) if out is not None else None
            if out is None or x is None:
                continue
            self.P[i] = _np(out)
            self.P64[i] = linear(_np(x), c.module.weight, c.module.bias)
            self.P32[i] = linear(_np(x), c.module.weight, c.module.bias, np.float32)
        self.got = _np(merged)
        self.out = _np(cap.out)
        self.o_index: int | None = None
        self.offset: np.ndarray | float = 0.0  # a constant per channel after the attention
        self.heads_read = True  # the head count is the module's own attribute

    def core_check(self, cand: Candidate, keep: np.ndarray, quick: bool = True) -> str | None:
        """None when the core agrees with the oracle on this reading, else the measured
        error (``quick``: a reading far off is rejected by the vectorised float64 core).

        A constant per channel added after the attention is a bias on v (the weights sum
        to 1): the same family of modules with other weights, so it agrees (``offset``)."""
        q, k, v = cand.split(self.P)
        scale = 1 / math.sqrt(cand.d)
        base = cand.merge(core(q, k, v, keep, scale, dtype=np.float32))
        near = cand.merge(core(q, k, v, keep, scale))
        finite = bool(np.isfinite(self.got).all())
        shift = (self.got - near).mean(axis=(0, 1)) if finite else 0.0
        if quick and all(passes(self.got - s, near, base, "attention core") is not None
                         for s in (0.0, shift)):
            return "far off"
        ref = cand.merge(oracle_core(q, k, v, keep))
        err = passes(self.got, ref, base, "attention core")
        if err is None or not finite:
            return err
        shift = (self.got - ref).mean(axis=(0, 1))
        if passes(self.got - shift, ref, base, "attention core") is None:
            self.offset = shift
            return None
        return err

    def whole_check(self, cand: Candidate, keep: np.ndarray) -> str | None:
        if self.o is None:
            return None  # no output projection: the core is the output
        q, k, v = cand.split(self.P64)
        ref = linear(cand.merge(oracle_core(q, k, v, keep)) + self.offset, self.o.weight,
                     self.o.bias)
        q, k, v = cand.split(self.P32)
        mid = cand.merge(core(q, k, v, keep, 1 / math.sqrt(cand.d), dtype=np.float32))
        mid = (mid + self.offset).astype(np.float32)
        base = linear(mid, self.o.weight, self.o.bias, np.float32)
        return passes(self.out, ref, base, "output")

    def fits(self, cand: Candidate, keep: np.ndarray, scale: float, kind: str) -> str | None:
        """None when the reading ``(scale, kind)`` explains the captured core."""
        q, k, v = cand.split(self.P)
        ref = cand.merge(core(q, k, v, keep, scale, kind))
        base = cand.merge(core(q, k, v, keep, scale, kind, np.float32))
        if passes(self.got, ref, base, "reading") is None:
            return None
        return "no"


def compare_with_oracle(h: Any, factory: Any) -> Outcome:
    """Compare the module under check (``h.m``, see :class:`~attnkit.check.multihead.probe.Harness`)
    with the float64 oracle from its own weights.

    Args:
        h: the harness (how the module is called).
        factory: what the user gave (a class or factory can be built again at another head
            dim, to name a scale that does not follow it).

    Returns:
        An :class:`Outcome`: never a finding without a reading that explains it, never
        ``compared`` True unless the core was compared.
    """
    E = 16
    xq = _rand(B, T, E, seed=21)
    xkv = xq if h.self_only else _rand(B, T, E, seed=22)
    # a value input of its own, unless the module takes one tensor as key and value
    xv = None if h.self_only or h.kv_shared else _rand(B, T, E, seed=29)
    m = h.eval(h.m)
    try:
        cap = capture(h, m, xq, xkv, xv)
        with torch.no_grad():
            again = h.call(m, xq, None if h.self_only else xkv, xv=xv)
    except Exception as err:  # the first call of the check reports what it raises
        return Outcome(False, say("oracle.why-raised", error=type(err).__name__))
    if cap.out.shape != (B, T, E):
        return Outcome(False, say("oracle.why-output-shape", shape=tuple(cap.out.shape)))
    if not torch.equal(again, cap.out):  # dropout left on: the dropout probe says so
        return Outcome(False, say("oracle.why-random"))
    if cap.inner is not None:
        return compare_inner(cap, h, B, T)
    H, read = heads_of(m, E, 4)
    cands, why = [], ""
    for H_ in [H] if read else [4, 2, 8, 1, 16]:  # no attribute names it: any that fits
        found, why_ = candidates(cap, h.self_only, H_)
        cands, why = cands + found, why or why_
    if not cands:
        return Outcome(False, why)
    o, merged, last = output_projection(cap)
    o_index = next((i for i, c in enumerate(cap.linears) if c.module is o), None)
    if merged is None:
        merged, how = cap.out, say("oracle.out-none")
    elif not last:
        how = say("oracle.out-then")
    else:
        how = say("oracle.out-bias" if o.bias is not None else "oracle.out-no-bias")
    r = Reading(cap, merged, o if last else None)
    r.o_index = o_index
    r.heads_read = read
    causal_first = getattr(h, "behaves_causal", None)
    for cand in cands:
        for causal, keep in _keeps(T, causal_first):
            if r.got.shape[-1] != cand.H * cand.dv or r.core_check(cand, keep) is not None:
                continue
            structure = _words(cand, how, causal)
            if np.any(r.offset != 0):
                structure = say("oracle.offset", structure=structure)
            wrong = misread_inputs(h, cap, cand, keep, r.got - r.offset)
            if wrong is not None:  # k or v projected from the other input
                return Outcome(True, "", structure, wrong)
            err = r.whole_check(cand, keep)
            if err is None:
                return Outcome(True, "", structure)
            return Outcome(True, "", structure, Finding("inaccurate", say("oracle.whole"), err))
    outcome = _explain(h, factory, r, cands, causal_first, how)
    f = outcome.finding
    if f is not None and not f.reproducer:
        f.reproducer = (batch_mixing_repro(h) if f.code == "mixes-queries" else
                        core_repro(h, cap, outcome.cand or cands[0], o_index,
                                   outcome.causal))
    return outcome


def _words(cand: Candidate, how: str, causal: bool) -> str:
    heads = (say("oracle.heads", H=cand.H, d=cand.d) if cand.Hkv == cand.H else
             say("oracle.heads-kv", H=cand.H, d=cand.d, Hkv=cand.Hkv))
    return say("oracle.structure-causal" if causal else "oracle.structure", label=cand.label,
               heads=heads, how=how)


def _named(scale: float, E: int, d: int) -> list[str]:
    names = []
    for name, value in (("none", 1.0), ("sqrt(E)", 1 / math.sqrt(E)), ("1/d", 1 / d),
                        ("sqrt(d)", math.sqrt(d))):
        if math.isclose(scale, value, rel_tol=1e-3):
            names.append(name)
    return names


def _explain(h: Any, factory: Any, r: Reading, cands: list[Candidate], causal_first: bool | None,
             how: str) -> Outcome:
    E = r.cap.xq.shape[-1]
    # A reading that fits: named scales first, then a fitted one, the axis, a sigmoid.
    for cand in cands:
        if r.got.shape[-1] != cand.H * cand.dv:
            continue
        default = 1 / math.sqrt(cand.d)
        for causal, keep in _keeps(T, causal_first):
            structure = _words(cand, how, causal)
            tried = [1.0, 1 / math.sqrt(E), 1 / cand.d, math.sqrt(cand.d)]
            q, k, v = cand.split(r.P)
            fitted = fit_scale(q, k, v, keep, _unmerge(cand, r.got))
            for scale in [s for s in tried + [fitted]
                          if not math.isclose(s, default, rel_tol=1e-3)]:
                if r.fits(cand, keep, scale, "softmax") is None:
                    words = _scale_words(h, factory, scale, E, cand)
                    return Outcome(True, "", structure, cand=cand, causal=causal, finding=Finding(
                        "wrong-scale", say("oracle.wrong-scale", words=words),
                        say("oracle.wrong-scale-measured", scale=scale, default=default)))
            if r.fits(cand, keep, default, "queries") is None:
                return Outcome(True, "", structure, cand=cand, causal=causal, finding=Finding(
                    "inaccurate", say("oracle.queries-axis"),
                    say("oracle.queries-axis-measured")))
            for scale in (default, 1.0):
                if r.fits(cand, keep, scale, "sigmoid") is None:
                    lo, hi = _sums(q, k, v, keep, scale)
                    return Outcome(True, "", structure, cand=cand, causal=causal, finding=Finding(
                        "inaccurate", say("oracle.sigmoid"),
                        say("oracle.sigmoid-measured", lo=lo, hi=hi)))
    for cand in cands if r.heads_read else []:  # another head count than it says
        for H2 in (1, 2, 4, 8, 16):
            if H2 == cand.H or cand.interleave or r.got.shape[-1] % H2:
                continue
            alt = _reheaded(cand, H2, r)
            if alt is None:
                continue
            for causal, keep in _keeps(T, causal_first):
                if r.fits(alt, keep, 1 / math.sqrt(alt.d), "softmax") is None:
                    return Outcome(True, "", _words(cand, how, causal), cand=cand, causal=causal,
                                   finding=Finding(
                        "inaccurate", say("oracle.heads-count", H2=H2, d2=alt.d, H=cand.H,
                                          d=cand.d),
                        say("oracle.heads-count-measured", H2=H2)))
    return _unexplained(h, r, cands, causal_first, how)


def _unmerge(cand: Candidate, got: np.ndarray) -> np.ndarray:
    """The merged ``(B, T, H * dv)`` core back as the :func:`core` output, for fitting."""
    Bn, Tq = got.shape[:2]
    if cand.layout == "hd":
        return got.reshape(Bn, Tq, cand.H, cand.dv).transpose(0, 2, 1, 3)
    return got.reshape(Bn, Tq, cand.dv, cand.H).transpose(0, 3, 1, 2)


def _sums(q: np.ndarray, k: np.ndarray, v: np.ndarray, keep: np.ndarray,
          scale: float) -> tuple[float, float]:
    """The least and the largest sum of a query's sigmoid weights over the keys."""
    G = q.shape[1] // k.shape[1]
    k = np.repeat(k, G, axis=1)
    w = 1 / (1 + np.exp(-(q @ np.swapaxes(k, -1, -2)) * scale)) * keep
    s = w.sum(-1)
    return float(s.min()), float(s.max())


def _reheaded(cand: Candidate, H2: int, r: Reading) -> Candidate | None:
    if cand.Hkv != cand.H:
        return None
    nq = cand.H * cand.d
    if nq % H2 or (cand.H * cand.dv) % H2:
        return None
    return Candidate(cand.label, cand.parts, H2, H2, nq // H2, cand.H * cand.dv // H2,
                     cand.layout)


def _scale_words(h: Any, factory: Any, scale: float, E: int, cand: Candidate) -> str:
    default = 1 / math.sqrt(cand.d)
    names = _named(scale, E, cand.d)
    other = _second_scale(h, factory)
    if other is not None and math.isclose(other, scale, rel_tol=1e-3) and "none" not in names:
        key = "constant"
    elif names == ["none"] or names == ["sqrt(d)"]:
        key = names[0]
    elif "sqrt(E)" in names and "1/d" in names:
        key = "E or d"
        if other is not None:  # built again at E = 32, d = 16: 1/sqrt(E) and 1/d differ
            key = "sqrt(E)" if math.isclose(other, 1 / math.sqrt(32), rel_tol=1e-3) else \
                "1/d" if math.isclose(other, 1 / 16, rel_tol=1e-3) else "E or d"
    elif names:
        key = names[0]
    else:
        key = "fitted"
    return say("oracle.scale-" + key, value=scale, default=default)


def _second_scale(h: Any, factory: Any) -> float | None:
    """The fitted scale of the same class built at width 32 with 2 heads (head dim 16);
    None where it cannot be built so or its core is not read."""
    from ..meet.build import build_module

    if not (inspect.isclass(factory) or inspect.isroutine(factory)):
        return None
    try:
        m = h.eval(build_module(factory, 32, 2, None, causal=h.causal).obj)
        from .gradients import dropout_knobs

        dropout_knobs(m, 0.0)
        x = _rand(B, T, 32, seed=23)
        cap = capture(h, m, x, x if h.self_only else _rand(B, T, 32, seed=24))
        H, _ = heads_of(m, 32, 2)
        cands, _ = candidates(cap, h.self_only, H)
        o, merged, last = output_projection(cap)
        r = Reading(cap, cap.out if merged is None else merged, o if last else None)
    except Exception:
        return None
    for cand in cands:
        if r.got.shape[-1] != cand.H * cand.dv:
            continue
        for _, keep in _keeps(T, bool(getattr(h, "behaves_causal", False))):
            q, k, v = cand.split(r.P)
            s = fit_scale(q, k, v, keep, _unmerge(cand, r.got))
            if r.fits(cand, keep, s, "softmax") is None:
                return s
    return None


def _unexplained(h: Any, r: Reading, cands: list[Candidate], causal_first: bool | None,
                 how: str) -> Outcome:
    m = h.eval(h.m)
    structure = _words(cands[0], how, bool(causal_first))
    if batch_mixing(h, m, r.cap):
        return Outcome(True, "", structure, Finding(
            "mixes-queries", say("oracle.batch-mixing"), say("oracle.batch-mixing-measured")))
    merged = _merged_without_transpose(r, cands)
    if merged is not None:
        return Outcome(True, "", structure, Finding(
            "mixes-queries", say("oracle.merge-no-transpose"),
            say("oracle.merge-no-transpose-measured"), reproducer=mixing_repro(
                h, m, r.cap, merged, r.o_index, bool(causal_first))),
            cand=merged, causal=bool(causal_first))
    split = split_without_transpose(r.got, r.P, cands, _keeps(T, None))
    if split is not None:  # heads split with view(B, H, T, d)
        cand, causal = split
        return Outcome(True, "", _words(cand, how, causal), Finding(
            "mixes-queries", say("oracle.split-no-transpose"),
            say("oracle.split-no-transpose-measured"),
            reproducer=mixing_repro(h, m, r.cap, cand, r.o_index, causal)),
            cand=cand, causal=causal)
    if r.cap.others:
        name, cls, _ = r.cap.others[0]
        low = cls.lower()
        key = ("oracle.why-norm" if "norm" in low else
               "oracle.why-module" if "rot" in low or "pos" in low else "oracle.why-other")
        return Outcome(False, say(key, cls=cls, name=name))
    fit = [c for c in cands if r.got.shape[-1] == c.H * c.dv]
    sources = {(c.parts[2], c.interleave): c for c in fit}  # each reading of v once
    if not any(linear_in_v(h, m, r.cap, c) for c in sources.values()):
        return Outcome(False, say("oracle.why-not-dot-product"))
    extra = extra_parameters(m)
    if extra:
        return Outcome(False, say("oracle.why-parameters", names=", ".join(extra[:4])))
    if not causal_first:
        if positional(h, m, r.cap):
            return Outcome(False, say("oracle.why-positions"))
    else:
        if tokens_alone(h, m, r.cap):
            return Outcome(True, "", structure, Finding(
                "inaccurate", say("oracle.tokens-alone"), say("oracle.tokens-alone-measured")),
                cand=fit[0] if fit else cands[0], causal=True)
        diag = next((c for c in fit if diagonal_masked(r.got, c, r.P)), None)
        if diag is not None:  # a causal mask of triu(0) or tril(-1): no query sees itself
            return Outcome(True, "", structure, Finding(
                "inaccurate", say("oracle.diagonal-masked"),
                say("oracle.diagonal-masked-measured")), cand=diag, causal=True)
        return Outcome(False, say("oracle.why-causal"))
    keep = _keeps(T, causal_first)[0][1]
    err = r.core_check(fit[0], keep, quick=False)
    return Outcome(True, "", structure, Finding(
        "inaccurate", say("oracle.unexplained"), err or say("oracle.no-reading")),
        cand=fit[0], causal=bool(causal_first))


def _merged_without_transpose(r: Reading, cands: list[Candidate]) -> Candidate | None:
    """The reading whose oracle core, merged as ``(B, H, T, dv).reshape(B, T, H * dv)``
    (no transpose: the memory of the heads read as tokens), is what the output projection
    received: heads merged so that each output token holds pieces of other tokens. Tried
    causal and not, at 1/sqrt(d); None when no reading fits."""
    T_ = r.got.shape[1]
    for cand in cands:
        if cand.interleave or cand.cycle or cand.layout != "hd":
            continue
        q, k, v = cand.split(r.P)
        if q.shape[2] != T_ or r.got.shape[-1] != cand.H * cand.dv:
            continue
        for _causal, keep in _keeps(T_, None):
            scale = 1 / math.sqrt(cand.d)
            ref = oracle_core(q, k, v, keep)
            base = core(q, k, v, keep, scale, dtype=np.float32)
            flat = ref.reshape(r.got.shape)  # (B, H, T, dv) read as (B, T, H * dv)
            if passes(r.got, flat, base.reshape(r.got.shape), "merge") is None and \
                    passes(r.got, cand.merge(ref), cand.merge(base), "merge") is not None:
                return cand
    return None
