"""Which input each projection of ``m(query, key, value)`` reads: the oracle projects the
keys from ``key`` and the values from ``value``. The check calls the module with a value
tensor of its own (not the key again), so the forward hooks show what each ``nn.Linear``
got; a reading of the structure that fits the captured core tells which of them gives k
and which v. A module whose values come from the key (``self.v(key)``: value never read),
whose keys come from the value, or that swaps the two computes the attention right on the
wrong inputs: its core, from the inputs the oracle uses, disagrees.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from ..core.report import Finding
from ..core.repro import note, said
from .oracle_words import say
from .reference import core, linear, oracle_core, passes
from .structure import Candidate, Capture, batch_first, same

__all__ = ["misread_inputs"]


def _reads(cap: Capture, i: int) -> str | None:
    """``"key"`` or ``"value"``: the input linear ``i`` read; None for neither."""
    x = cap.linears[i].args[0]
    return "key" if same(x, cap.xkv) else "value" if same(x, cap.xv) else None


def _projected(cap: Capture, i: int, x: torch.Tensor, dtype: Any) -> np.ndarray | None:
    """Linear ``i`` applied to the batch-first input ``x`` in ``dtype``."""
    c = cap.linears[i]
    if batch_first(c.args[0], *x.shape[:2]) is None:
        return None
    return linear(x.detach().double().numpy(), c.module.weight, c.module.bias, dtype)


def _core_from_inputs(cap: Capture, cand: Candidate, keep: np.ndarray,
                      dtype: Any) -> np.ndarray | None:
    """The merged core ``(B, Tq, H * dv)`` with q from ``query``, k from ``key`` and v from
    ``value`` through the projections of the reading ``cand``, in ``dtype`` (float64: the
    oracle's row-by-row core)."""
    parts = []
    used = {i for i, _, _ in cand.parts}
    for role, x in enumerate((cap.xq, cap.xkv, cap.xv)):
        P = {i: _projected(cap, i, x, dtype) for i in used}
        if any(p is None for p in P.values()):
            return None
        parts.append(cand.split(P)[role])  # type: ignore[arg-type]
    q, k, v = parts
    if np.dtype(dtype) == np.float64:
        return cand.merge(oracle_core(q, k, v, keep))
    return cand.merge(core(q, k, v, keep, 1 / math.sqrt(cand.d), dtype=dtype))


def misread_inputs(h: Any, cap: Capture, cand: Candidate, keep: np.ndarray,
                   got: np.ndarray) -> Finding | None:
    """The finding for an ``m(query, key, value)`` module whose k or v projection reads the
    other input (``got``: the merged core the module computed, ``(B, Tq, H * dv)``); None
    when each reads its own, or the core from the right inputs agrees anyway."""
    if h.self_only or cap.xv is None or torch.equal(cap.xkv, cap.xv):
        return None
    k_in, v_in = _reads(cap, cand.parts[1][0]), _reads(cap, cand.parts[2][0])
    if (k_in, v_in) == ("key", "value") or None in (k_in, v_in):
        return None
    ref = _core_from_inputs(cap, cand, keep, np.float64)
    base = _core_from_inputs(cap, cand, keep, np.float32)
    if ref is None or base is None:
        return None
    err = passes(got, ref, base, "attention core")
    if err is None:
        return None
    k_name, v_name = (cap.linears[cand.parts[j][0]].name or "?" for j in (1, 2))
    return roles_finding(h, k_in, v_in, err, k=k_name, v=v_name)


def roles_finding(h: Any, k_in: str, v_in: str, err: str, **names: Any) -> Finding:
    """``inaccurate``, named by which input gave the keys (``k_in``) and the values
    (``v_in``), with ``names``: ``k``/``v``, the projections that read them, or ``label``,
    the inner attention layer that got them. ``err``: the measured disagreement with the
    oracle on the right inputs."""
    key = ("key-value-swapped" if (k_in, v_in) == ("value", "key") else
           "value-from-key" if v_in == "key" else "key-from-value")
    key = ("oracle.inner-" if "label" in names else "oracle.") + key
    return Finding("inaccurate", say(key, **names), err,
                   reproducer=_repro(h, value_ignored=v_in == "key"))


def _repro(h: Any, value_ignored: bool) -> Any:
    """Values from the key: with one value token repeated, the output cannot move with the
    key (every weight multiplies the same value). Keys from the value: a new key must move
    the output."""
    lines = [f"{name} = torch.randn(x.shape, generator=torch.Generator().manual_seed({s}))"
             for name, s in (("key", 1), ("key2", 2))]
    if value_ignored:
        lines += [note("value = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))"
                       "[:, :1].expand(x.shape).contiguous()", "repro.one-value"),
                  "with torch.no_grad():",
                  "    a, b = run(x, key, value), run(x, key2, value)",
                  "assert torch.allclose(a, b, atol=1e-5), " + said("repro.values-from-key")]
    else:
        lines += ["value = torch.randn(x.shape, generator=torch.Generator().manual_seed(3))",
                  "with torch.no_grad():",
                  "    a, b = run(x, key, value), run(x, key2, value)",
                  "assert not torch.allclose(a, b, atol=1e-5), "
                  + said("repro.keys-from-value")]
    return h.repro(lines)
