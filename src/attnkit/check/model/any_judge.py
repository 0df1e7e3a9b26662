"""Judging one recorded attention call of any PyTorch model (:mod:`.torch_calls`)
against the float64 oracle, on what it received, by the 2x rule against plain math in the
call's own dtype on the same inputs.

- an SDPA call: ``q, k, v``, ``attn_mask`` (bool: True = may attend; float: added),
  ``is_causal`` (top-left, as SDPA defines it), ``scale``, ``enable_gqa``, as
  :func:`attnkit.testing.reference_attention` computes them;
- an ``nn.MultiheadAttention`` call: the module's own weights on the inputs it received,
  projections, masks (``key_padding_mask``, ``attn_mask``: True = may *not* attend),
  ``bias_k``/``bias_v`` and ``add_zero_attn`` included (:func:`mha_reference`).

A call beyond the rule is explained where another reading fits: NaN only in half
precision, else the readings every judge tries (:mod:`attnkit.check.core.readings`: causal
aligned the other way, the mask read the other way round, a causal leak, padding or the
window ignored, another scale), with the codes and words a transformers model's call gets
for the same bug; else it is ``inaccurate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...testing import max_mean_error, reference_attention
from ..catalogue import T
from ..core.oracle import Baseline, bound_of, rule_error
from ..core.readings import (
    Reading,
    first_fit,
    mask_chain,
    mask_parts,
    named_scales,
    polarity_reading,
    top_left_reading,
)
from .half import half_cause

__all__ = ["Judged", "call_arguments", "judge_raised", "judge_sdpa", "twin_finite"]

_HALF = ("float16", "bfloat16")


@dataclass
class Judged:
    """What judging one call found.

    Attributes:
        code: None when the call meets the rule, else the finding's code.
        message, measured: the finding's words and the error against the rule.
        error, bound: the call's max error against the oracle, and the rule's bound.
        at: ``batch``, ``head``, ``query`` of the first row beyond the bound.
        empty_rows: queries with no allowed key (not judged).
        keep, bias, scale: the mask (True = may attend), the additive float mask and the
            scale the oracle used, for the reproducer (SDPA calls).
        note: why nothing was judged ("" when something was).
    """

    code: str | None = None
    message: str = ""
    measured: str = ""
    error: float = 0.0
    bound: float = 0.0
    at: dict = field(default_factory=dict)
    empty_rows: int = 0
    keep: Any = None
    bias: Any = None
    scale: float = 1.0
    note: str = ""


def _np(t: Any) -> np.ndarray:
    return t.detach().double().cpu().numpy()


def _dtype(t: Any) -> str:
    return str(t.dtype).replace("torch.", "")


# -- SDPA ---------------------------------------------------------------------------------------
def _four(t: Any) -> Any:
    """``(..., T, D)`` -> ``(B, H, T, D)`` (the leading dims folded; 2-D: one batch, head)."""
    if t.ndim == 2:
        return t[None, None]
    if t.ndim == 3:
        return t[None]
    return t.reshape(-1, *t.shape[-3:])


def sdpa_case(a: dict) -> dict:
    """The oracle's view of an SDPA call: ``q, k, v`` ``(B, H, T, D)`` on the CPU, ``keep``
    ``(B, H, Tq, Tk)`` bool, ``bias`` (float mask, -inf turned into ``keep`` False) or None,
    ``scale``."""
    import torch

    q, k, v = (_four(a[n].cpu()) for n in ("query", "key", "value"))
    L, S = q.shape[-2], k.shape[-2]
    lead = a["query"].shape[:-2]
    keep = torch.ones(L, S, dtype=torch.bool)
    if a.get("is_causal"):
        keep = keep.tril()
    keep = keep.expand(*lead, L, S)
    bias = None
    mask = a.get("attn_mask")
    if isinstance(mask, torch.Tensor):
        m = mask.cpu().expand(*lead, L, S)
        if m.dtype == torch.bool:
            keep = keep & m
        else:
            m = m.double()
            keep = keep & ~torch.isneginf(m)
            bias = torch.where(torch.isfinite(m), m, torch.zeros((), dtype=m.dtype))
    H = q.shape[1]
    keep = _four(keep).expand(q.shape[0], H, L, S)
    if bias is not None:
        bias = _four(bias).expand(q.shape[0], H, L, S)
    scale = a.get("scale")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return {"q": q, "k": k, "v": v, "keep": keep, "bias": bias, "scale": scale,
            "dtype": _dtype(a["query"])}


def _sdpa_oracle(c: dict, keep: Any, scale: float) -> tuple[np.ndarray, np.ndarray]:
    """``(float64 oracle, same-dtype plain math)`` of an SDPA case, ``(B, H, Tq, Dv)``."""
    q64, k64, v64 = _np(c["q"]), _np(c["k"]), _np(c["v"])
    keep_np = np.asarray(keep)
    bias = None if c["bias"] is None else _np(c["bias"])
    ref = reference_attention(q64, k64, v64, mask=keep_np, bias=bias, scale=scale).out
    G = q64.shape[1] // k64.shape[1]
    base = Baseline("torch", c["dtype"]).attention(
        q64, np.repeat(k64, G, 1), np.repeat(v64, G, 1), keep_np, scale, bias=bias)["out"]
    return ref, base


def judge_sdpa(call: Any) -> Judged:
    import torch

    a = call.arguments
    if float(a.get("dropout_p") or 0.0) > 0:
        return Judged(note=T("any.dropout", p=a["dropout_p"]))
    c = sdpa_case(a)
    v = c["v"]
    out = call.output
    want = tuple(a["query"].shape[:-1]) + (v.shape[-1],)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != want:
        shape = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        return Judged("shape", T("any.sdpa-shape", shape=shape, want=want), "")
    got = _np(_four(out))
    keep = c["keep"].numpy()
    j = _rule(got, keep, lambda kp, s: _sdpa_oracle(c, kp, s), c["scale"])
    j.keep, j.bias, j.scale = keep, c["bias"], c["scale"]
    if j.code is None:
        return j
    return _explain(j, call, got, keep, sdpa_readings(c, a, keep),
                    lambda kp, s: _sdpa_oracle(c, kp, s))


def sdpa_readings(c: dict, a: dict, keep: np.ndarray) -> list[Reading | None]:
    """The other readings of an SDPA call (:func:`~..core.readings.mask_chain`, then the
    scales of :func:`~..core.readings.scale_readings`), its parts read from the call:
    ``is_causal`` (top-left, as SDPA defines it) and the mask it received."""
    import torch

    L, S = c["q"].shape[-2], c["k"].shape[-2]
    mask = a.get("attn_mask")
    mk = _mask_keep(mask, keep.shape)
    causal = bool(a.get("is_causal"))
    parts = mask_parts(keep, "top-left" if causal else None)
    top = None
    if causal and L != S:  # the call means top-left; bottom-right is the other reading
        top = Reading("causal-alignment", keep=np.tril(np.ones((L, S), dtype=bool), S - L) & mk,
                      words=T("any.top-left", Tq=L, Tk=S))
    elif parts.later is not None and L != S:
        top = top_left_reading(L, S, keep)
    within = parts.causal if causal else None
    bool_mask = isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
    chain = mask_chain(
        keep, top_left=top, polarity=polarity_reading(mk, within) if bool_mask else None,
        later=None if parts.later is None else parts.later & (mk if causal else True),
        padded=parts.padded, outside=parts.outside, window=parts.window,
        ignored=(within if causal else np.ones((L, S), dtype=bool))
        if isinstance(mask, torch.Tensor) else None)
    return chain + named_scales(c["q"].shape[-1], c["v"].shape[-1], c["scale"])


def _mask_keep(mask: Any, shape: tuple) -> np.ndarray:
    """The keys an ``attn_mask`` allows (True = may attend), as a bool array of ``shape``."""
    import torch

    if not isinstance(mask, torch.Tensor):
        return np.ones(shape, dtype=bool)
    m = mask.cpu()
    m = m if m.dtype == torch.bool else ~torch.isneginf(m.double())
    m = _four(m.expand(*m.shape[:-2], *shape[-2:])).numpy()
    return np.broadcast_to(m, shape)


# -- the rule and its explanations ----------------------------------------------------------------
def _rule(got: np.ndarray, keep: np.ndarray, oracle: Any, scale: float) -> Judged:
    """The 2x rule over the rows with an allowed key; ``code="inaccurate"`` when broken
    (refined by :func:`_explain`)."""
    rows = keep.any(-1)  # (B, H, Tq)
    empty = int((~rows).any(1).sum()) if rows.ndim == 3 else int((~rows).sum())
    if not rows.any():
        return Judged(empty_rows=empty, note=T("any.all-masked"))
    ref, base = oracle(keep, scale)
    g, r, b = got[rows], ref[rows], base[rows]
    ok = np.isfinite(g)
    err = max_mean_error(g[ok], r[ok])[0] if ok.all() else math.inf
    j = Judged(error=err, bound=bound_of(r, b, 2.0), empty_rows=empty)
    failure = rule_error(g, r, b, 2.0, "output")
    if failure is None:
        return j
    per_row = np.abs(got - ref).max(-1)
    per_row = np.where(np.isfinite(per_row), per_row, np.inf)
    bad = rows & (per_row > j.bound)
    if not bad.any():
        bad = rows
    idx = np.argwhere(bad)
    first = idx[np.lexsort(tuple(idx[:, i] for i in reversed(range(idx.shape[1]))))][0]
    names = ("batch", "head", "query") if got.ndim == 4 else ("batch", "query")
    j.code, j.measured = "inaccurate", failure
    j.at = {n: int(x) for n, x in zip(names, first)}
    return j


def _explain(j: Judged, call: Any, got: np.ndarray, keep: np.ndarray,
             readings: list[Reading | None], oracle: Any, fits: Any = None) -> Judged:
    """``j`` (beyond the rule) named: NaN only in half precision, else the first of
    ``readings`` whose oracle (``oracle(keep, scale)``) fits the output (``fits(keep,
    scale)``: another comparison), else ``inaccurate``."""
    rows = keep.any(-1)
    dtype = _dtype(call.output)
    if not np.isfinite(got[rows]).all():
        ref, _ = oracle(keep, j.scale if j.scale else 1.0)
        if np.isfinite(ref[rows]).all():
            if dtype in _HALF and twin_finite(call):
                j.code, j.message = "float16-overflow", T(
                    "any.half", dtype=dtype,
                    cause=_overflow_cause(call, dtype, "NaN/inf in the output"))
            else:
                j.code, j.message = "nan-or-inf", T("model.non-finite")
            return j
    own = j.scale if j.scale else 1.0

    def fit(alt: Any, scale: float | None) -> bool:
        alt_keep = np.broadcast_to(keep if alt is None else alt, keep.shape)
        alt_rows = alt_keep.any(-1) & rows
        if not alt_rows.any():
            return False
        r2, b2 = oracle(alt_keep, own if scale is None else scale)
        return rule_error(got[alt_rows], r2[alt_rows], b2[alt_rows], 2.0, "alt") is None

    found = first_fit(readings, fits or fit)
    if found is not None:
        j.code, j.message = found.code, found.words
        return j
    j.message = T("model.beyond-rule", dtype=dtype)
    return j


def _overflow_cause(call: Any, dtype: str, problem: str) -> Any:
    """Why ``call`` fails in ``dtype``, from the code that can be read: the implementation
    under test (torch's own SDPA is not read), and the module the call came from."""
    import torch.nn.functional as F

    fn = None if call.function is F.scaled_dot_product_attention or call.kind == "mha" \
        else call.function
    return half_cause(dtype, problem, fn, call.module)


def _float32(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor) and x.is_floating_point():
        return x.float()
    if isinstance(x, (tuple, list)):
        return type(x)(_float32(y) for y in x)
    return x


def call_arguments(call: Any, transform: Any = None) -> tuple[list, dict]:
    """``(args, kwargs)`` of an SDPA call as the model passed them (the first
    ``call.positional`` by position, the rest by the names it used), each through
    ``transform``."""
    from .torch_calls import SDPA_PARAMETERS

    t = transform or (lambda x: x)
    a = call.arguments
    args = [t(a[n]) for n in SDPA_PARAMETERS[:call.positional]]
    return args, {n: t(a[n]) for n in call.keywords}


def twin_finite(call: Any) -> bool:
    """The same call in float32 runs and gives a finite output (SDPA: the function on the
    float32 arguments; MHA: the module run on float32 copies of its weights, the module
    itself untouched)."""
    import torch

    a = call.arguments
    try:
        if call.kind == "sdpa":
            args, kw = call_arguments(call, _float32)
            out = call.function(*args, **kw)
        elif call.kind == "mha":  # the module with float32 copies of its weights
            m = call.module
            weights = {n: _float32(t) for n, t in
                       list(m.named_parameters()) + list(m.named_buffers())}
            out = torch.func.functional_call(m, weights, (),
                                             {n: _float32(x) for n, x in a.items()})
        else:
            return False
    except Exception:
        return False
    out = out[0] if isinstance(out, tuple) else out
    return isinstance(out, torch.Tensor) and bool(torch.isfinite(out).all())


def judge_raised(call: Any) -> Judged:
    """A call that raised: ``float16-overflow`` where the float32 twin runs, else
    ``call-failed``."""
    err = call.error
    text = (str(err).strip().splitlines() or [""])[0][:200]
    dtype = _dtype(call.arguments.get("query"))
    if dtype in _HALF and twin_finite(call):
        error = f"{type(err).__name__}: {text}"
        return Judged("float16-overflow", T("any.half-raised", dtype=dtype, error=error,
                                            cause=_overflow_cause(call, dtype, error)),
                      type(err).__name__)
    return Judged("call-failed", T("any.raised", error=f"{type(err).__name__}: {text}",
                                   shape=tuple(call.arguments["query"].shape), dtype=dtype),
                  type(err).__name__)


