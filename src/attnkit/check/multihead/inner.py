"""The oracle for a module that is, or wraps, ``torch.nn.MultiheadAttention`` or attnkit's
``MultiHeadAttention``: its weights are read where those classes keep them, the inner
module's own call is compared with the oracle on the inputs it got, and the wrapper's output
with the oracle on the wrapper's inputs (so a wrapper that feeds ``(B, T, E)`` to a
``batch_first=False`` layer is found, while the layer itself agrees).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..core.report import Finding
from .oracle_words import say
from .reference import core, linear, oracle_core, passes
from .structure import Capture, Outcome, same

__all__ = ["compare_inner"]

TORCH_ARGS = ("query", "key", "value", "key_padding_mask", "need_weights", "attn_mask",
              "average_attn_weights", "is_causal")
ATTNKIT_ARGS = ("query", "key", "value")


def _weights(mod: Any, kind: str) -> tuple[list, int, int, int, int, str]:
    """``([(W, b) for q, k, v, o], H, Hkv, d, dv, why-not)``."""
    if kind == "torch":
        if mod.bias_k is not None or mod.add_zero_attn:
            return [], 0, 0, 0, 0, say("oracle.why-inner-bias-kv")
        H = mod.num_heads
        if mod._qkv_same_embed_dim:
            ws = list(mod.in_proj_weight.chunk(3))
        else:
            ws = [mod.q_proj_weight, mod.k_proj_weight, mod.v_proj_weight]
        bs = list(mod.in_proj_bias.chunk(3)) if mod.in_proj_bias is not None else [None] * 3
        pairs = list(zip(ws, bs)) + [(mod.out_proj.weight, mod.out_proj.bias)]
        d = mod.embed_dim // H
        return pairs, H, H, d, d, ""
    if getattr(mod, "softcap", None) is not None or getattr(mod, "sinks", None) is not None:
        return [], 0, 0, 0, 0, say("oracle.why-inner-softcap")
    pairs = [(p.weight, p.bias) for p in (mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj)]
    return pairs, mod.num_heads, mod.num_kv_heads, mod.head_dim, mod.v_head_dim, ""


def _inputs(call: Any, kind: str) -> tuple[list, dict]:
    names = TORCH_ARGS if kind == "torch" else ATTNKIT_ARGS
    given = dict(zip(names, call.args))
    given.update(call.kwargs)
    q = given.get("query")
    k = given.get("key")
    k = q if k is None else k
    v = given.get("value")
    v = k if v is None else v
    return [q, k, v], given


def _keep(given: dict, kind: str, Bn: int, Tq: int, Tk: int) -> tuple[np.ndarray | None, str]:
    """The bool keep-mask ``(B, 1, Tq, Tk)`` the inner call got, or ``(None, why)``."""
    keep = np.ones((Bn, 1, Tq, Tk), dtype=bool)
    causal = np.tril(np.ones((Tq, Tk), dtype=bool), k=Tk - Tq)
    if kind == "torch":
        for name in ("attn_mask", "key_padding_mask"):
            mask = given.get(name)
            if mask is None:
                continue
            mask = mask.detach()
            if mask.dtype == torch.bool:
                allowed = ~mask
            elif bool(((mask == 0) | torch.isneginf(mask)).all()):
                allowed = mask == 0
            else:
                return None, say("oracle.why-inner-float-mask", name=name)
            a = allowed.numpy()
            if name == "key_padding_mask":
                a = a.reshape(Bn, 1, 1, Tk)
            elif a.ndim == 3:
                return None, say("oracle.why-inner-head-mask")
            keep = keep & a
        if given.get("is_causal") and given.get("attn_mask") is None:
            keep = keep & causal
        return keep, ""
    for name in ("bias", "window", "segment_ids", "padding_mask", "cache"):
        if given.get(name) is not None:
            return None, say("oracle.why-inner-argument", name=name)
    mask = given.get("mask")
    if mask is not None:
        if mask.dtype != torch.bool:
            return None, say("oracle.why-inner-float-mask", name="mask=")
        m = mask.detach().numpy()
        keep = keep & (m[:, None] if m.ndim == 3 else m)
    lens = given.get("valid_lens")
    if lens is not None:
        lens = lens.detach().numpy()
        if lens.ndim != 1:
            return None, say("oracle.why-inner-lens")
        keep = keep & (np.arange(Tk)[None, :] < lens[:, None])[:, None, None, :]
    causal_arg = given.get("causal")
    if causal_arg not in (None, False, True):
        return None, say("oracle.why-inner-causal", value=repr(causal_arg))
    if causal_arg:
        keep = keep & causal
    return keep, ""


def _attend(xs: list, pairs: list, H: int, Hkv: int, d: int, dv: int,
            keep: np.ndarray, dtype: Any) -> np.ndarray:
    """The whole layer in ``dtype`` (float64: the oracle's attention) on the batch-first
    inputs ``xs`` (query, key, value)."""
    xq, xk, xv = xs
    Bn, Tq, Tk = xq.shape[0], xq.shape[1], xk.shape[1]
    q = linear(xq, *pairs[0], dtype).reshape(Bn, Tq, H, d).transpose(0, 2, 1, 3)
    k = linear(xk, *pairs[1], dtype).reshape(Bn, Tk, Hkv, d).transpose(0, 2, 1, 3)
    v = linear(xv, *pairs[2], dtype).reshape(Bn, Tk, Hkv, dv).transpose(0, 2, 1, 3)
    if np.dtype(dtype) == np.float64:
        o = oracle_core(q, k, v, np.broadcast_to(keep, (Bn, H, Tq, Tk)))
    else:
        o = core(q, k, v, keep, 1 / math.sqrt(d), dtype=dtype)
    merged = o.transpose(0, 2, 1, 3).reshape(Bn, Tq, H * dv)
    return linear(merged, *pairs[3], dtype)


def compare_inner(cap: Capture, h: Any, Bn: int, T: int) -> Any:
    """The oracle :class:`~attnkit.check.multihead.oracle.Outcome` of a module built around (or
    being) an ``nn.MultiheadAttention`` or attnkit ``MultiHeadAttention``."""
    assert cap.inner is not None
    call, kind = cap.inner.call, cap.inner.kind
    mod = call.module
    label = say("oracle.inner-torch" if kind == "torch" else "oracle.inner-attnkit")
    if call.name:
        label = say("oracle.inner-named", label=label, name=call.name)
    pairs, H, Hkv, d, dv, why = _weights(mod, kind)
    if why:
        return Outcome(False, say("oracle.why-inner", label=label, why=why))
    (q_in, k_in, v_in), given = _inputs(call, kind)
    first = bool(getattr(mod, "batch_first", kind != "torch"))
    xs = []
    for x in (q_in, k_in, v_in):
        if not isinstance(x, torch.Tensor) or x.dim() != 3:
            return Outcome(False, say("oracle.why-inner", label=label,
                                      why=say("oracle.why-inner-inputs")))
        xs.append((x if first else x.transpose(0, 1)).detach().double().numpy())
    if xs[1].shape != xs[2].shape:
        return Outcome(False, say("oracle.why-inner", label=label, why=say("oracle.why-inner-kv")))
    keep, why = _keep(given, kind, xs[0].shape[0], xs[0].shape[1], xs[1].shape[1])
    if keep is None:
        return Outcome(False, say("oracle.why-inner", label=label, why=why))
    out = call.out[0] if isinstance(call.out, (tuple, list)) else call.out
    got = (out if first else out.transpose(0, 1)).detach().double().numpy()
    heads = (say("oracle.heads", H=H, d=d) if Hkv == H else
             say("oracle.heads-kv", H=H, d=d, Hkv=Hkv))
    structure = say("oracle.inner-structure", label=label, heads=heads)
    ref = _attend(xs, pairs, H, Hkv, d, dv, keep, np.float64)
    base = _attend(xs, pairs, H, Hkv, d, dv, keep, np.float32)
    err = passes(got, ref, base, "inner attention")
    if err is not None:
        return Outcome(True, "", structure, Finding(
            "inaccurate", say("oracle.inner-disagrees", label=label), err))
    # The wrapper: its input and output are the inner layer's, in any layout? (key and
    # value perhaps the wrong way round: judged against the oracle on the right ones)
    roles = _roles(cap, h, k_in, v_in)
    if not (same(q_in, cap.xq) and roles is not None and same(out, cap.out)):
        return Outcome(True, "", say("oracle.inner-alone", structure=structure))
    wxs = [x.double().numpy() for x in (cap.xq, cap.xkv, cap.xv)]
    Tq, Tk = wxs[0].shape[1], wxs[1].shape[1]
    wkeep = keep if keep.shape[-2:] == (Tq, Tk) and keep.shape[0] == Bn else \
        np.ones((Bn, 1, Tq, Tk), dtype=bool)
    ref = _attend(wxs, pairs, H, Hkv, d, dv, wkeep, np.float64)
    base = _attend(wxs, pairs, H, Hkv, d, dv, wkeep, np.float32)
    err = passes(cap.out.double().numpy(), ref, base, "output")
    if err is None:
        return Outcome(True, "", structure)
    if roles != ("key", "value"):
        from .roles import roles_finding

        return Outcome(True, "", structure, roles_finding(h, *roles, err, label=label))
    if not first and tuple(q_in.shape[:2]) == (Bn, T):
        from .oracle_repro import batch_mixing_repro

        return Outcome(True, "", structure, Finding(
            "mixes-queries", say("oracle.inner-batch-first", label=label), err,
            reproducer=batch_mixing_repro(h)))
    return Outcome(True, "", structure, Finding(
        "inaccurate", say("oracle.inner-wrapper", label=label), err))


def _roles(cap: Capture, h: Any, k_in: Any, v_in: Any) -> tuple[str, str] | None:
    """Which of the wrapper's inputs (``"key"``, ``"value"``) the inner layer got as its
    key and its value; None where either is neither."""
    if h.self_only or torch.equal(cap.xkv, cap.xv):  # type: ignore[arg-type]
        return ("key", "value") if same(k_in, cap.xkv) and same(v_in, cap.xkv) else None
    k_from = "key" if same(k_in, cap.xkv) else "value" if same(k_in, cap.xv) else None
    v_from = "key" if same(v_in, cap.xkv) else "value" if same(v_in, cap.xv) else None
    return None if k_from is None or v_from is None else (k_from, v_from)
