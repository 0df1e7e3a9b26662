"""A ``flex_attention`` call judged on what it received: its ``mask_mod`` and ``score_mod``
evaluated on the whole (batch, head, query, key) grid, the float64 oracle
(:func:`attnkit.testing.reference_attention` on the modified scores) against what the call
returned, by the 2x rule against the same math in the call's own dtype.

The recorder sees the operator ``flex_attention`` runs (its arguments: ``query, key,
value, score_mod, block_mask (a tuple ending in mask_mod), scale, kernel_options, ...``);
while it records, ``flex_attention`` runs its operator directly instead of compiling it
(the switch torch provides for debugging ``score_mod``), so each call reaches it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ...testing import reference_attention
from ..catalogue import T
from ..core.readings import mask_chain, mask_parts, named_scales, polarity_reading
from .any_judge import Judged, _dtype, _explain, _np, _rule

__all__ = ["judge_flex"]


def _grid(B: int, H: int, L: int, S: int) -> tuple[Any, Any, Any, Any]:
    import torch

    return (torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
            torch.arange(L).view(1, 1, L, 1), torch.arange(S).view(1, 1, 1, S))


def _scores(q: Any, k: Any, scale: float, score_mod: Any, dtype: Any) -> Any:
    """``score_mod(scale * q k^T, b, h, i, j)`` in ``dtype``, ``(B, H, L, S)``."""
    G = q.shape[1] // k.shape[1]
    s = (q.to(dtype) @ k.to(dtype).repeat_interleave(G, 1).transpose(-1, -2)) * scale
    if score_mod is None:
        return s
    out = score_mod(s, *_grid(*s.shape))
    return out.expand(s.shape).to(dtype)


def judge_flex(call: Any) -> Judged:
    """Judge one ``flex_attention`` call (see the module's docstring)."""
    import torch

    args = call.arguments["args"]
    q, k, v, score_mod, block = (x.cpu() if isinstance(x, torch.Tensor) else x
                                 for x in args[:5])
    scale = args[5] if len(args) > 5 and args[5] is not None else 1.0 / math.sqrt(q.shape[-1])
    mask_mod = block[-1] if isinstance(block, tuple) and block and callable(block[-1]) \
        else None
    B, H, L, _ = q.shape
    S = k.shape[-2]
    try:
        keep = torch.ones(B, H, L, S, dtype=torch.bool)
        if mask_mod is not None:
            keep = keep & mask_mod(*_grid(B, H, L, S)).expand(B, H, L, S).bool()
        scores64 = _scores(q, k, float(scale), score_mod, torch.float64)
    except Exception as err:  # a mod that does not broadcast over the grid
        return Judged(note=T("any.flex-grid", error=type(err).__name__))
    dtype = _dtype(q)
    out = call.output
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (B, H, L, v.shape[-1]):
        return Judged(note=T("any.flex-shape"))
    keep_np = keep.numpy()
    G = H // k.shape[1]
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}

    def oracle(kp: np.ndarray, s: float) -> tuple[np.ndarray, np.ndarray]:
        kp = np.array(np.broadcast_to(kp, keep_np.shape))
        key = (s, kp.tobytes())
        if key not in cache:
            sc = scores64 if s == float(scale) else _scores(q, k, s, score_mod, torch.float64)
            ref = reference_attention(_np(q), _np(k), _np(v), scores=sc.numpy(), mask=kp).out
            base_s = _scores(q, k, s, score_mod, q.dtype).masked_fill(
                ~torch.from_numpy(kp), float("-inf"))
            w = torch.softmax(base_s, -1).nan_to_num(0.0)
            cache[key] = (ref, _np(w @ v.repeat_interleave(G, 1)))
        return cache[key]

    got = _np(out)
    j = _rule(got, keep_np, oracle, float(scale))
    j.scale = float(scale)
    if j.code is None:
        return j
    parts = mask_parts(keep_np)
    readings = mask_chain(
        keep_np, polarity=None if mask_mod is None else polarity_reading(keep_np),
        later=parts.later, padded=parts.padded, outside=parts.outside, window=parts.window)
    j = _explain(j, call, got, keep_np,
                 readings + named_scales(q.shape[-1], v.shape[-1], float(scale)), oracle)
    if dtype not in ("float16", "bfloat16") and j.code == "float16-overflow":
        j.code = "nan-or-inf"
    return j
