"""The explorer page's data: inputs normalised, weights quantized, packed and put in the page.

Everything here is NumPy and the standard library. The page's script
(``explorer_data.js``) reads what :func:`page_html` writes:

- each head: ``{"data": base64(deflate(codes))}`` plus ``"step"`` (float32 per row) for
  uint8 codes, where ``weight = code * step[row]``; float16 heads hold IEEE half floats;
- masks: one bit per cell (``np.packbits`` order), deflated, at their own (unbroadcast)
  size over layers and heads;
- thumbnails: every head max-pooled to at most THUMB x THUMB, codes 0..254 of the head's
  maximum, THUMB_MASKED where a block is wholly masked.
"""

from __future__ import annotations

import base64
import html
import json
import zlib
from collections.abc import Sequence
from importlib import resources
from string import Template
from typing import Any

import numpy as np

__all__ = [
    "COLORS",
    "THUMB",
    "THUMB_MASKED",
    "as_array",
    "b64",
    "deflate",
    "encode_head",
    "encode_masks",
    "estimate_size",
    "head_maxima",
    "mask_own_size",
    "page_html",
    "quantize",
    "stack_layers",
    "thumbnail",
    "thumbnails",
    "token_labels",
]

THUMB = 48  # thumbnails pool each head to at most THUMB x THUMB cells
THUMB_MASKED = 255  # thumbnail code of a block whose cells are all masked
# Anchor colours of the sequential scale, near-white (weight 0) to dark red (the maximum):
# the look of matplotlib's "Reds", which the heatmaps use.
COLORS = ("#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d",
          "#a50f15", "#67000d")


# -- inputs ----------------------------------------------------------------------------------
def as_array(x: Any, name: str) -> np.ndarray:
    """A NumPy array from an array-like or a torch tensor, without importing torch."""
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if t.dtype.is_floating_point and t.dtype.itemsize < 4:
            t = t.float()  # NumPy has no bfloat16
        x = t.numpy()
    arr = np.asarray(x)
    if arr.dtype != np.bool_ and not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr


def _pick_batch(arr: np.ndarray, batch: int, what: str) -> np.ndarray:
    if not -arr.shape[0] <= batch < arr.shape[0]:
        raise ValueError(f"batch={batch} out of range for {what} of shape {arr.shape}")
    return arr[batch]


def stack_layers(weights: Any, batch: int) -> np.ndarray:
    """``(L, H, Tq, Tk)`` float32 from any accepted layout (see :func:`explore`)."""
    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError("weights is an empty sequence: no layer to show")
        layers = []
        for i, w in enumerate(weights):
            a = as_array(w, f"weights[{i}]")
            if a.ndim == 4:  # (B, H, Tq, Tk), as transformers' output_attentions
                a = _pick_batch(a, batch, f"weights[{i}]")
            elif a.ndim != 3:
                raise ValueError(
                    f"weights[{i}] must be (H, Tq, Tk) or (B, H, Tq, Tk), got shape {a.shape}"
                )
            if layers and a.shape != layers[0].shape:
                raise ValueError(
                    f"every layer must have one shape: weights[0] gives {layers[0].shape}, "
                    f"weights[{i}] gives {a.shape}"
                )
            layers.append(a.astype(np.float32, copy=False))
        return np.stack(layers)
    a = as_array(weights, "weights")
    if a.ndim == 5:  # (L, B, H, Tq, Tk)
        a = _pick_batch(a.swapaxes(0, 1), batch, "weights (L, B, H, Tq, Tk)")
    elif a.ndim in (2, 3, 4):
        a = a.reshape((1,) * (4 - a.ndim) + a.shape)
    else:
        raise ValueError(
            "weights must be (Tq, Tk), (H, Tq, Tk), (L, H, Tq, Tk), (L, B, H, Tq, Tk) or a "
            f"sequence of (H, Tq, Tk) / (B, H, Tq, Tk) per layer; got shape {a.shape}"
        )
    return a.astype(np.float32, copy=False)


def mask_own_size(mask: Any, shape: tuple[int, int, int, int]) -> np.ndarray:
    """The mask at its own (unbroadcast) size ``(1 or L, 1 or H, Tq, Tk)``, bool."""
    m = as_array(mask, "mask")
    if m.dtype != np.bool_:
        raise TypeError(f"mask must be bool (True = may attend), got dtype {m.dtype}")
    if m.ndim > 4:
        raise ValueError(f"mask must broadcast to (L, H, Tq, Tk) = {shape}, got shape {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    if any(d not in (1, n) for d, n in zip(m.shape, shape)):
        raise ValueError(f"mask of shape {m.shape} is not broadcastable to weights {shape}")
    return np.ascontiguousarray(np.broadcast_to(m, m.shape[:2] + shape[2:]))


def token_labels(tokens: Sequence[Any] | None, n: int, name: str) -> tuple[str, ...]:
    if tokens is None:
        return tuple(str(i) for i in range(n))
    if isinstance(tokens, str):
        raise TypeError(f"{name} must be a sequence of token strings, not one string")
    out = tuple(str(t) for t in tokens)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} tokens, weights have {n} there")
    return out


# -- encoding --------------------------------------------------------------------------------
# -- packing ---------------------------------------------------------------------------------
def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def deflate(data: bytes, *, rle: bool = False) -> str:
    """Deflate (zlib wrapper, as the browser's ``DecompressionStream("deflate")`` reads)
    then base64.

    ``rle=True`` for quantized weights: run-length matching only, then Huffman. On
    attention codes it is ~3x faster than the default string matching (~10x at few
    levels) and 5-15% smaller, since long matches are rare and cost the Huffman tables.
    """
    z = zlib.compressobj(6, zlib.DEFLATED, 15, 9,
                         zlib.Z_RLE if rle else zlib.Z_DEFAULT_STRATEGY)
    return b64(z.compress(data) + z.flush())


def quantize(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(codes uint8 (Tq, Tk), step float32 (Tq,))`` with ``w ~= codes * step[:, None]``."""
    top = w.max(axis=-1)
    step = np.where(top > 0, top / levels, 1.0).astype(np.float32)
    codes = np.rint(w / step[:, None]).clip(0, levels).astype(np.uint8)
    return codes, step


def thumbnail(w: np.ndarray, keep: np.ndarray | None, head_max: float) -> np.ndarray:
    """Max-pool ``w (Tq, Tk)`` to at most THUMB x THUMB; codes 0..254 of ``head_max``, and
    THUMB_MASKED where every cell of a block is masked."""
    tq, tk = w.shape
    rows = (np.arange(min(tq, THUMB)) * tq) // min(tq, THUMB)
    cols = (np.arange(min(tk, THUMB)) * tk) // min(tk, THUMB)
    pooled = np.maximum.reduceat(np.maximum.reduceat(w, rows, axis=0), cols, axis=1)
    code = np.rint(np.clip(pooled / head_max, 0.0, 1.0) * 254).astype(np.uint8)
    if keep is not None:
        k = keep.astype(np.uint8)
        any_kept = np.maximum.reduceat(np.maximum.reduceat(k, rows, axis=0), cols, axis=1)
        code[any_kept == 0] = THUMB_MASKED
    return code


def head_maxima(weights: np.ndarray, keep_of: Any) -> list[list[float]]:
    """``[layer][head]``: the largest allowed weight (1 where there is none above 0).
    ``keep_of(layer, head)`` gives the ``(Tq, Tk)`` mask or None."""
    out = []
    for li in range(weights.shape[0]):
        row = []
        for h in range(weights.shape[1]):
            w, k = weights[li, h], keep_of(li, h)
            shown = w if k is None else w[k]
            top = float(shown.max()) if shown.size else 0.0
            row.append(top if top > 0 else 1.0)
        out.append(row)
    return out


def thumbnails(weights: np.ndarray, keep_of: Any, head_max: list[list[float]]) -> str:
    """Every head's thumbnail, ``(L, H, rows, cols)`` uint8, packed."""
    L, H = weights.shape[:2]
    codes = np.stack([
        np.stack([thumbnail(weights[li, h], keep_of(li, h), head_max[li][h])
                  for h in range(H)])
        for li in range(L)
    ])
    return deflate(codes.tobytes())


def encode_masks(mask: np.ndarray | None) -> dict[str, Any] | None:
    """``{"L", "H", "data": [[packed bits]]}`` of a ``(1 or L, 1 or H, Tq, Tk)`` mask."""
    if mask is None:
        return None
    Lm, Hm = mask.shape[:2]
    return {"L": Lm, "H": Hm, "data": [
        [deflate(np.packbits(mask[li, h].reshape(-1)).tobytes()) for h in range(Hm)]
        for li in range(Lm)
    ]}


def encode_head(w: np.ndarray, keep: np.ndarray | None, levels: int | None) -> dict[str, str]:
    """One head ``(Tq, Tk)``: ``levels`` steps of each row's maximum, or float16 (None)."""
    if keep is not None:
        w = np.where(keep, w, 0.0).astype(np.float32)  # masked cells cost nothing
    if levels is None:
        return {"data": deflate(w.astype("<f2").tobytes())}
    codes, step = quantize(w, levels)
    return {"data": deflate(codes.tobytes(), rle=True), "step": b64(step.astype("<f4").tobytes())}


def estimate_size(weights: np.ndarray, keep_of: Any, levels: int) -> float:
    """Bytes the heads of a page would take at ``levels``, from a sample of one head per
    layer (scaled by the head count)."""
    L, H = weights.shape[:2]
    sample = [(li, (li * 5) % H) for li in range(L)]
    size = sum(len(encode_head(weights[li, h], keep_of(li, h), levels)["data"])
               for li, h in sample)
    return size / len(sample) * L * H


def page_html(payload: dict[str, Any], title: str) -> str:
    """The page: ``explorer.html`` with its style, its scripts and ``payload`` inlined."""
    # JSON inside <script>: escape <, > and & so that no token can close the element.
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    assets = resources.files("attnkit.viz")
    text = {name: assets.joinpath(name).read_text(encoding="utf-8")
            for name in ("explorer.html", "explorer.css", "explorer_data.js", "explorer.js")}
    return Template(text["explorer.html"]).substitute(
        title=html.escape(title), css=text["explorer.css"], data=data,
        js_data=text["explorer_data.js"], js=text["explorer.js"])
