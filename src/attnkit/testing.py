"""Judging a backend: the one float64 reference, and the error rule every backend is judged by.

:func:`reference_attention` is the float64 reference every attention test compares with:
written from the definitions (masks, variants and their order), row by row, without calling
any attnkit backend, so it can judge the NumPy oracle too. It returns the output, the weights, the
log-sum-exp and, given a cotangent, the gradients, and covers every option of every backend
(mask, bias, valid_lens, causal (either alignment), window, scale, softcap, sinks,
segment_ids, ALiBi, GQA).

A lower-precision result passes when its max error against the float64 reference is at
most ``factor`` times the max error of a plain same-precision math implementation, plus
``atol`` (factor 2 for outputs, 3 for dK/dV, 5 for dQ): :func:`assert_close_by_rule`. NaN
where the reference has none fails, and so does a finite value where it has NaN. The
baseline's error is measured where the baseline is finite, so a NaN in it cannot lift the
bound. Failure messages carry max and mean errors.

Accepts NumPy arrays and anything with ``.detach().cpu()`` (torch tensors), without
importing torch.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "ReferenceResult",
    "allowed",
    "as_float64",
    "assert_close_by_rule",
    "band_keep",
    "large_logit_inputs",
    "lengths_keep",
    "max_mean_error",
    "reference_attention",
    "segments_keep",
    "softmax_row",
]


def as_float64(x: Any) -> np.ndarray:
    """A float64 NumPy copy of an array or tensor (bf16 tensors included)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu()
        if hasattr(x, "double"):
            x = x.double()
        x = x.numpy()
    return np.array(x, dtype=np.float64)


def max_mean_error(actual: Any, reference: Any) -> tuple[float, float]:
    """Max and mean absolute error over entries where both are finite and agree on inf."""
    a, r = as_float64(actual), as_float64(reference)
    with np.errstate(invalid="ignore"):  # inf - inf where both agree: zeroed below
        diff = np.abs(a - r)
    same_inf = np.isinf(a) & np.isinf(r) & (np.sign(a) == np.sign(r))
    diff = np.where(same_inf, 0.0, diff)
    if diff.size == 0:
        return 0.0, 0.0
    return float(np.max(diff)), float(np.mean(diff))


def assert_close_by_rule(
    actual: Any,
    reference: Any,
    baseline: Any,
    *,
    factor: float,
    atol: float = 1e-5,
    name: str = "output",
) -> None:
    """Assert ``err(actual) <= factor * err(baseline) + atol`` against the float64 reference.

    Args:
        actual: the result under test.
        reference: the float64 reference result.
        baseline: a plain math implementation's result in the same dtype as ``actual``.
        factor: 2 (outputs), 3 (dK, dV) or 5 (dQ).
        atol: absolute slack.
        name: what is compared, for the message.
    """
    a, r, b = as_float64(actual), as_float64(reference), as_float64(baseline)
    if a.shape != r.shape:
        raise AssertionError(f"{name}: shape {a.shape} != reference shape {r.shape}")
    nan_a, nan_r = np.isnan(a), np.isnan(r)
    if np.any(nan_a & ~nan_r):
        raise AssertionError(
            f"{name}: {int(np.sum(nan_a & ~nan_r))} NaN where the reference has none"
        )
    if np.any(nan_r & ~nan_a):
        raise AssertionError(
            f"{name}: {int(np.sum(nan_r & ~nan_a))} finite where the reference is NaN "
            f"(NaN in an attended position must propagate)"
        )
    inf_bad = np.isinf(a) & ~(np.isinf(r) & (np.sign(a) == np.sign(r)))
    if np.any(inf_bad):
        raise AssertionError(f"{name}: {int(np.sum(inf_bad))} inf where the reference differs")
    ok = ~nan_r
    err_max, err_mean = max_mean_error(a[ok], r[ok])
    # The baseline's error is taken where the baseline is usable: one NaN or wrong inf in
    # it would make the bound NaN or inf, and then any error at all would pass.
    b_ok = ok & ~np.isnan(b) & ~(np.isinf(b) & ~(np.isinf(r) & (np.sign(b) == np.sign(r))))
    base_max, base_mean = max_mean_error(b[b_ok], r[b_ok])
    bound = factor * base_max + atol
    if err_max > bound:
        raise AssertionError(
            f"{name}: max error {err_max:.3e} (mean {err_mean:.3e}) exceeds {factor} x "
            f"baseline {base_max:.3e} (mean {base_mean:.3e}) + {atol:g} = {bound:.3e}"
        )


# -- the float64 reference -----------------------------------------------------------------


def allowed(i: int, j: int, Tq: int, Tk: int, causal: bool | str, window: Any) -> bool:
    """Causal (True or ``"bottom_right"``) keeps ``j <= i + Tk - Tq``,
    ``"top_left"`` keeps ``j <= i``; window ``(left, right)`` keeps
    ``diag - left <= j <= diag + right`` around the bottom-right diagonal ``diag`` (with
    either causal alignment); None = unbounded."""
    diag = i + Tk - Tq
    if causal == "top_left":
        if j > i:
            return False
    elif causal and j > diag:
        return False
    if window is not None:
        left, right = window
        if left is not None and j < diag - left:
            return False
        if right is not None and j > diag + right:
            return False
    return True


def band_keep(Tq: int, Tk: int, causal: bool | str = False, window: Any = None) -> np.ndarray:
    """``(Tq, Tk)`` bool (True = may attend), built one element at a time."""
    keep = np.zeros((Tq, Tk), dtype=bool)
    for i in range(Tq):
        for j in range(Tk):
            keep[i, j] = allowed(i, j, Tq, Tk, causal, window)
    return keep


def lengths_keep(valid_lens: Any, lead: tuple[int, ...], Tq: int, Tk: int) -> np.ndarray:
    """d2l ``valid_lens`` as bool ``lead + (Tq, Tk)``; ``lead[0]`` is the batch axis.

    1-D ``(B,)``: every query of batch row ``b`` sees keys ``j < valid_lens[b]``.
    2-D ``(B, Tq)``: query ``i`` of batch row ``b`` sees keys ``j < valid_lens[b, i]``.
    """
    vl = np.asarray(valid_lens)
    keep = np.zeros(lead + (Tq, Tk), dtype=bool)
    for idx in np.ndindex(*lead):
        b = idx[0]
        for i in range(Tq):
            n = int(vl[b]) if vl.ndim == 1 else int(vl[b, i])
            keep[idx + (i,)] = np.arange(Tk) < n
    return keep


def segments_keep(segment_ids: Any, lead: tuple[int, ...], Tq: int, Tk: int) -> np.ndarray:
    """``segment_ids`` as bool ``lead + (Tq, Tk)``, ``lead[0]`` the batch axis: query ``i``
    of row ``b`` may attend key ``j`` iff ``q_ids[b, i] == kv_ids[b, j] >= 0``.

    ``segment_ids`` is one ``(B, T)`` array (self-attention) or a pair ``(q_ids, kv_ids)``.
    """
    if isinstance(segment_ids, (tuple, list)):
        q_ids, kv_ids = (as_float64(x) for x in segment_ids)
    else:
        q_ids = kv_ids = as_float64(segment_ids)
    keep = np.zeros(lead + (Tq, Tk), dtype=bool)
    for idx in np.ndindex(*lead):
        b = idx[0]
        for i in range(Tq):
            for j in range(Tk):
                keep[idx + (i, j)] = q_ids[b, i] >= 0 and q_ids[b, i] == kv_ids[b, j]
    return keep


def softmax_row(
    s: np.ndarray, keep: np.ndarray, sink: float | None = None
) -> tuple[np.ndarray, float]:
    """Weights and natural-log LSE of one row, over the kept entries only (float64).

    A ``-inf`` score counts as excluded. ``sink``: one more logit in the denominator with
    no value (the weights then sum to less than 1, and the LSE includes it). The row
    maximum is subtracted for the exponentials and the sum is exact (``math.fsum``); an
    empty row gives zeros and ``-inf`` (the sink, with a sink).
    """
    s = np.asarray(s, dtype=np.float64)
    js = np.flatnonzero(np.asarray(keep, dtype=bool) & (s != -math.inf))
    w = np.zeros(s.shape[0])
    if js.size == 0:
        return w, (-math.inf if sink is None else float(sink))
    m = np.max(s[js]) if sink is None else max(np.max(s[js]), float(sink))
    e = np.exp(s[js] - m)
    total = math.fsum(list(e) + ([] if sink is None else [math.exp(float(sink) - m)]))
    w[js] = e / total
    return w, m + math.log(total)


class ReferenceResult(NamedTuple):
    """What :func:`reference_attention` returns, all float64 NumPy arrays."""

    out: np.ndarray  # (..., Tq, Dv)
    weights: np.ndarray  # (..., Tq, Tk)
    lse: np.ndarray  # (..., Tq), natural log; -inf for a row with no allowed key
    dq: np.ndarray | None = None  # gradients, when d_out was given
    dk: np.ndarray | None = None
    dv: np.ndarray | None = None
    dsinks: np.ndarray | None = None  # (H,), when sinks and d_out were given


def reference_attention(
    q: Any,
    k: Any,
    v: Any,
    *,
    mask: Any = None,
    bias: Any = None,
    valid_lens: Any = None,
    causal: bool | str = False,
    window: Any = None,
    scale: float | None = None,
    softcap: float | None = None,
    sinks: Any = None,
    segment_ids: Any = None,
    alibi_slopes: Any = None,
    scores: Any = None,
    d_out: Any = None,
    d_lse: Any = None,
) -> ReferenceResult:
    """Float64 attention from the definitions, one query row at a time.

    Each row: ``s_j = scale * q.k_j``, then ``softcap * tanh(s / softcap)``, then ``+ bias``
    and ``- slope * |i + Tk - Tq - j|`` (ALiBi), then the masks; the softmax and the sum
    over values take only the allowed keys (so nothing masked can leak, NaN included).
    With sinks, the head's sink logit ``z`` joins each row's denominator with no value.
    Given ``d_out`` (and optionally ``d_lse``), the gradients follow by the chain rule on
    the same row: ``dP_j = dO . v_j``, ``dS_j = P_j (dP_j - sum_j P_j dP_j) + dLSE P_j``,
    times ``1 - tanh^2`` under softcap; ``dq = scale sum_j dS_j k_j``,
    ``dk_j += scale dS_j q``, ``dv_j += P_j dO``; the sink gets
    ``dz += P_z (dLSE - sum_j P_j dP_j)`` with ``P_z = exp(z - LSE)``.

    Args:
        q: ``(..., H, Tq, Dk)`` (or ``(..., Tq, Dk)``); arrays or tensors.
        k: ``(..., Hkv, Tk, Dk)`` with q's leading dims; query head ``h`` reads key/value
            head ``h // (H // Hkv)``.
        v: ``(..., Hkv, Tk, Dv)``.
        mask: bool, True = may attend, broadcastable to ``(..., Tq, Tk)``.
        bias: float, broadcastable, added to the (capped) scores.
        valid_lens: ``(B,)`` or ``(B, Tq)``, ``B`` the first leading dim.
        causal: True/``"bottom_right"`` or ``"top_left"``; window: the band around the
            bottom-right diagonal.
        scale: None = ``1/sqrt(Dk)``.
        softcap: None = off.
        sinks: ``(H,)``, one logit per query head (q's axis -3; ``(1,)`` without one).
        segment_ids: ``(B, T)`` or ``(q_ids (B, Tq), kv_ids (B, Tk))``, ``B`` the first
            leading dim.
        alibi_slopes: ``(H,)`` or ``(B, H)`` (q's leading dims ``(B, H)``).
        scores: ``(..., Tq, Tk)`` scores to use instead of ``scale * q k^T`` (additive
            attention); no gradients then.
        d_out: cotangent of ``out``, ``(..., Tq, Dv)``; None = no gradients.
        d_lse: cotangent of ``lse``, ``(..., Tq)``; None = 0.

    Returns:
        :class:`ReferenceResult`; ``dq``, ``dk``, ``dv`` shaped like q, k, v (and
        ``dsinks (H,)`` with sinks) when ``d_out`` is given.
    """
    q, k, v = as_float64(q), as_float64(k), as_float64(v)
    Tq, Tk, Dv = q.shape[-2], k.shape[-2], v.shape[-1]
    lead = q.shape[:-2]
    G = q.shape[-3] // k.shape[-3] if q.ndim >= 3 else 1
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    keep = np.broadcast_to(band_keep(Tq, Tk, causal, window), lead + (Tq, Tk)).copy()
    if mask is not None:
        keep &= np.broadcast_to(np.asarray(mask), keep.shape)
    if valid_lens is not None:
        keep &= lengths_keep(valid_lens, lead, Tq, Tk)
    if segment_ids is not None:
        keep &= segments_keep(segment_ids, lead, Tq, Tk)
    z = None if sinks is None else as_float64(sinks).reshape(-1)
    b_full = None if bias is None else np.broadcast_to(as_float64(bias), keep.shape)
    scores = None if scores is None else np.broadcast_to(as_float64(scores), keep.shape)
    slopes = None if alibi_slopes is None else np.broadcast_to(as_float64(alibi_slopes), lead)
    grads = d_out is not None
    if grads and scores is not None:
        raise ValueError("reference_attention gives gradients for q k^T scores only")
    if grads:
        d_out = np.broadcast_to(as_float64(d_out), lead + (Tq, Dv))
        d_lse = np.zeros(lead + (Tq,)) if d_lse is None else as_float64(d_lse)
        dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
        dz = None if z is None else np.zeros(z.shape)

    out = np.zeros(lead + (Tq, Dv))
    weights = np.zeros(lead + (Tq, Tk))
    lse = np.zeros(lead + (Tq,))
    for idx in np.ndindex(*lead):
        kidx = idx if q.ndim < 3 else idx[:-1] + (idx[-1] // G,)  # head h -> h // G
        K, V = k[kidx], v[kidx]
        h = idx[-1] if q.ndim >= 3 else 0
        sink = None if z is None else z[h]
        for i in range(Tq):
            at = idx + (i,)
            tanh = None
            if scores is None:
                row = (K @ q[at]) * scale
                if softcap is not None:
                    tanh = np.tanh(row / softcap)
                    row = softcap * tanh
            else:
                row = scores[at]
            if b_full is not None:
                row = row + b_full[at]
            if slopes is not None:
                row = row - slopes[idx] * np.abs(i + Tk - Tq - np.arange(Tk))
            w, lse[at] = softmax_row(row, keep[at], sink)
            weights[at] = w
            js = np.flatnonzero(w != 0.0)  # the keys this row attends
            out[at] = w[js] @ V[js]
            if grads:
                dp = V[js] @ d_out[at]
                ds = w[js] * (dp - w[js] @ dp) + d_lse[at] * w[js]
                if tanh is not None:
                    ds = ds * (1.0 - tanh[js] ** 2)
                dq[at] = scale * (ds @ K[js])
                dk[kidx][js] += scale * np.outer(ds, q[at])
                dv[kidx][js] += np.outer(w[js], d_out[at])
                if dz is not None:
                    dz[h] += math.exp(sink - lse[at]) * (d_lse[at] - w[js] @ dp)
    if not grads:
        return ReferenceResult(out, weights, lse)
    return ReferenceResult(out, weights, lse, dq, dk, dv, dz)


# -- inputs that break LSE precision -----------------------------------------------------


def large_logit_inputs(
    B: int = 1, H: int = 2, Hkv: int | None = None, Tq: int = 16, Tk: int = 45,
    Dv: int = 16, *, logit: float = 1e4, seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(q, k, v, d_out)``, float64, whose scaled scores are ``logit + O(1)`` and exact in
    float32, at ``Dk = 64`` and scale ``1/8`` (the default ``1/sqrt(Dk)``, a power of two).

    q and k are multiples of 1/8 (so every product and partial sum is exact in float32),
    with one large common component: every score carries the offset ``logit``, as in a
    sequence whose logits drift far from 0, while the softmax itself is O(1). Plain float32
    math is then exact up to its O(1) rounding, so a backend that rounds anything at the
    LSE's magnitude (5e-4 at 1e4 in float32) fails the error rule against it
    (:func:`assert_close_by_rule`).

    Shapes: q ``(B, H, Tq, 64)``, k ``(B, Hkv, Tk, 64)``, v ``(B, Hkv, Tk, Dv)``, d_out
    ``(B, H, Tq, Dv)`` (``Hkv`` defaults to ``H``).
    """
    Hkv = H if Hkv is None else Hkv
    g = np.random.default_rng(seed)
    q = np.round(g.uniform(-2, 2, (B, H, Tq, 64)) * 8) / 8
    k = np.round(g.uniform(-2, 2, (B, Hkv, Tk, 64)) * 8) / 8
    q[..., 0] = 256.0
    k[..., 0] = np.round(logit * 8 / 256.0 * 8) / 8  # scale 1/8: 256 * k0 / 8 ~ logit
    v = g.standard_normal((B, Hkv, Tk, Dv))
    d_out = g.standard_normal((B, H, Tq, Dv))
    return q, k, v, d_out
