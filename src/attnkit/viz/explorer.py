"""A standalone HTML attention explorer: one self-contained file, no server, no network.

:func:`explore` takes attention weights per layer and head with their tokens and returns an
:class:`Explorer`, which writes one HTML page (``save``), shows inline in Jupyter
(``_repr_html_``) and saves its inputs for later (``save_npz``, read back by
:func:`load_npz`). The page has:

- an overview of every layer x head as thumbnails, heads grouped by the key/value head they
  share (GQA/MQA);
- a *lines* view of one head: query tokens left, key tokens right, lines weighted by
  attention; hovering a token shows its lines alone and marks its top key;
- a *matrix* view of one head drawn on a canvas (one pixel per cell at most), which stays
  responsive at 2,048 tokens; masked cells are grey stripes, never the near-white of a
  weight ~0;
- the keyboard: left/right pick the head, up/down the layer, ``l``/``m`` the view, ``s`` the
  colour scale.

Shape legend::

    L  layers    B  batch    H  query heads    Hkv  key/value heads (H % Hkv == 0)
    Tq query length (rows)   Tk key length (columns)

How the weights are stored in the page. With ``precision="uint8"`` (the default) each row of
each head keeps ``levels`` steps of its own maximum: ``code = round(w / row_max * levels)``,
one byte per cell, with ``row_max / levels`` as a float32 per row; a weight reads back within
half a step, ``row_max / (2 * levels)``. ``levels`` is 255 (8 bits) unless the page would
pass ``max_bytes``; then it drops (127, 63, 47, 31, 23, 15) until the page fits. With
``precision="float16"`` the weights are IEEE half floats. Either way each head is deflated
and base64-encoded; the page inflates it with the browser's ``DecompressionStream`` when it
is shown. Masked cells are stored as 0 beside a bit-packed mask.

Torch tensors are read through ``.detach().cpu()``; torch is never imported here, nor is
matplotlib.
"""

from __future__ import annotations

import argparse
import base64
import html
import importlib
import json
import os
import re
import sys
import zipfile
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "Explorer",
    "ModelLoader",
    "add_view_arguments",
    "explore",
    "load_npz",
    "run_view",
    "view_file",
    "view_main",
]

PathLike = str | os.PathLike
ModelLoader = Callable[[str, str], tuple[Any, Sequence[str]]]
"""``loader(model_name_or_path, text) -> (attentions, tokens)``: what ``attnkit view MODEL``
calls. ``attentions`` is anything :func:`explore` takes, e.g. a transformers model's
``output_attentions`` (a tuple of ``(B, H, T, T)``, one per layer)."""

NPZ_FORMAT = "attnkit.explorer/1"
PRECISIONS = ("uint8", "float16")
LEVELS = (255, 127, 63, 47, 31, 23, 15)  # steps per row max, tried in order vs max_bytes
THUMB = 48  # thumbnails pool each head to at most THUMB x THUMB cells
THUMB_MASKED = 255  # thumbnail code of a block whose cells are all masked
LINES_MAX_TOKENS = 1024  # the lines view draws up to this many tokens per side
DEFAULT_MAX_BYTES = 20_000_000


# -- input -----------------------------------------------------------------------------------
def _to_numpy(x: Any, name: str) -> np.ndarray:
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


def _stack_layers(weights: Any, batch: int) -> np.ndarray:
    """``(L, H, Tq, Tk)`` float32 from any accepted layout (see :func:`explore`)."""
    if isinstance(weights, (list, tuple)):
        if not weights:
            raise ValueError("weights is an empty sequence: no layer to show")
        layers = []
        for i, w in enumerate(weights):
            a = _to_numpy(w, f"weights[{i}]")
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
    a = _to_numpy(weights, "weights")
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


def _mask_4d(mask: Any, shape: tuple[int, int, int, int]) -> np.ndarray:
    """The mask at its own (unbroadcast) size ``(1 or L, 1 or H, Tq, Tk)``, bool."""
    m = _to_numpy(mask, "mask")
    if m.dtype != np.bool_:
        raise TypeError(f"mask must be bool (True = may attend), got dtype {m.dtype}")
    if m.ndim > 4:
        raise ValueError(f"mask must broadcast to (L, H, Tq, Tk) = {shape}, got shape {m.shape}")
    m = m.reshape((1,) * (4 - m.ndim) + m.shape)
    if any(d not in (1, n) for d, n in zip(m.shape, shape)):
        raise ValueError(f"mask of shape {m.shape} is not broadcastable to weights {shape}")
    return np.ascontiguousarray(np.broadcast_to(m, m.shape[:2] + shape[2:]))


def _tokens(tokens: Sequence[Any] | None, n: int, name: str) -> tuple[str, ...]:
    if tokens is None:
        return tuple(str(i) for i in range(n))
    if isinstance(tokens, str):
        raise TypeError(f"{name} must be a sequence of token strings, not one string")
    out = tuple(str(t) for t in tokens)
    if len(out) != n:
        raise ValueError(f"{name} has {len(out)} tokens, weights have {n} there")
    return out


# -- encoding --------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _deflate(data: bytes, *, rle: bool = False) -> str:
    """Deflate (zlib wrapper, as the browser's ``DecompressionStream("deflate")`` reads)
    then base64.

    ``rle=True`` for quantized weights: run-length matching only, then Huffman. On
    attention codes it is ~3x faster than the default string matching (~10x at few
    levels) and 5-15% smaller, since long matches are rare and cost the Huffman tables.
    """
    z = zlib.compressobj(6, zlib.DEFLATED, 15, 9,
                         zlib.Z_RLE if rle else zlib.Z_DEFAULT_STRATEGY)
    return _b64(z.compress(data) + z.flush())


def _quantize(w: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """``(codes uint8 (Tq, Tk), step float32 (Tq,))`` with ``w ~= codes * step[:, None]``."""
    top = w.max(axis=-1)
    step = np.where(top > 0, top / levels, 1.0).astype(np.float32)
    codes = np.rint(w / step[:, None]).clip(0, levels).astype(np.uint8)
    return codes, step


def _thumbnail(w: np.ndarray, keep: np.ndarray | None, head_max: float) -> np.ndarray:
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


def _colormap() -> list[str]:
    """Anchor colours of the sequential scale, near-white (weight 0) to dark red (the
    maximum): the look of matplotlib's "Reds", which the heatmaps use."""
    return ["#fff5f0", "#fee0d2", "#fcbba1", "#fc9272", "#fb6a4a", "#ef3b2c", "#cb181d",
            "#a50f15", "#67000d"]


@dataclass
class Explorer:
    """Attention weights with their tokens, ready to be written as one HTML page.

    Build it with :func:`explore` or :func:`load_npz`. Attributes are the normalised
    inputs: ``weights`` ``(L, H, Tq, Tk)`` float32, ``mask`` bool ``(1 or L, 1 or H, Tq,
    Tk)`` (True = may attend) or None, ``kv_heads`` (``Hkv``), ``layer_ids`` (the layer
    numbers shown), and the page options.
    """

    weights: np.ndarray
    q_tokens: tuple[str, ...]
    k_tokens: tuple[str, ...]
    mask: np.ndarray | None = None
    kv_heads: int | None = None
    layer_ids: tuple[int, ...] = ()
    title: str = "attention"
    precision: str = "uint8"
    max_bytes: int | None = DEFAULT_MAX_BYTES
    view: str = "auto"
    _html: str | None = field(default=None, init=False, repr=False)
    _levels: int | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        L, H, Tq, Tk = self.weights.shape
        if Tq == 0 or Tk == 0 or H == 0:
            raise ValueError(f"nothing to show: weights have shape {self.weights.shape}")
        if not np.all(np.isfinite(self.weights)):
            raise ValueError("weights hold NaN or inf; the explorer shows finite weights only")
        if self.weights.size and float(self.weights.min()) < 0:
            raise ValueError(f"weights must be >= 0, got a minimum of {self.weights.min():g}")
        if self.kv_heads is None:
            self.kv_heads = H
        if not (isinstance(self.kv_heads, (int, np.integer)) and 0 < self.kv_heads <= H
                and H % self.kv_heads == 0):
            raise ValueError(f"kv_heads must divide H = {H} (H % Hkv == 0), got {self.kv_heads}")
        self.kv_heads = int(self.kv_heads)
        if not self.layer_ids:
            self.layer_ids = tuple(range(L))
        if len(self.layer_ids) != L:
            raise ValueError(f"layer_ids has {len(self.layer_ids)} entries for {L} layers")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {self.precision!r}")
        if self.view not in ("auto", "lines", "matrix"):
            raise ValueError(f"view must be 'auto', 'lines' or 'matrix', got {self.view!r}")
        if self.max_bytes is not None and self.max_bytes <= 0:
            raise ValueError(f"max_bytes must be positive or None, got {self.max_bytes}")

    # -- shape ----------------------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, int, int, int]:
        """``(L, H, Tq, Tk)``."""
        L, H, Tq, Tk = self.weights.shape
        return L, H, Tq, Tk

    @property
    def levels(self) -> int | None:
        """Steps per row maximum in the page (``precision="uint8"``), known once the page
        is built; None for float16."""
        self.html()
        return self._levels

    def keep(self, layer: int, head: int) -> np.ndarray | None:
        """The ``(Tq, Tk)`` mask of one layer and head (True = may attend), or None."""
        if self.mask is None:
            return None
        return self.mask[layer if self.mask.shape[0] > 1 else 0,
                         head if self.mask.shape[1] > 1 else 0]

    # -- page -----------------------------------------------------------------------------
    def _head_max(self) -> list[list[float]]:
        L, H, _, _ = self.shape
        out = []
        for li in range(L):
            row = []
            for h in range(H):
                w, k = self.weights[li, h], self.keep(li, h)
                shown = w if k is None else w[k]
                top = float(shown.max()) if shown.size else 0.0
                row.append(top if top > 0 else 1.0)
            out.append(row)
        return out

    def _encode_heads(self, levels: int | None) -> list[list[dict[str, str]]]:
        L, H, _, _ = self.shape
        layers = []
        for li in range(L):
            heads = []
            for h in range(H):
                w = self.weights[li, h]
                k = self.keep(li, h)
                if k is not None:
                    w = np.where(k, w, 0.0).astype(np.float32)
                if levels is None:
                    heads.append({"data": _deflate(w.astype("<f2").tobytes())})
                else:
                    codes, step = _quantize(w, levels)
                    heads.append({"data": _deflate(codes.tobytes(), rle=True),
                                  "step": _b64(step.astype("<f4").tobytes())})
            layers.append(heads)
        return layers

    def _payload(self, levels: int | None, head_max: list[list[float]],
                 thumbs: str, masks: dict[str, Any] | None) -> dict[str, Any]:
        L, H, Tq, Tk = self.shape
        view = self.view
        if view == "auto":
            view = "lines" if max(Tq, Tk) <= 128 else "matrix"
        return {
            "format": NPZ_FORMAT, "title": self.title,
            "L": L, "H": H, "Hkv": self.kv_heads, "Tq": Tq, "Tk": Tk,
            "layers": list(self.layer_ids),
            "qTokens": list(self.q_tokens), "kTokens": list(self.k_tokens),
            "precision": self.precision, "levels": levels, "view": view,
            "linesMax": LINES_MAX_TOKENS,
            "headMax": head_max, "colors": _colormap(),
            "thumb": {"rows": min(Tq, THUMB), "cols": min(Tk, THUMB), "data": thumbs},
            "mask": masks, "heads": self._encode_heads(levels),
        }

    def _page(self, payload: dict[str, Any]) -> str:
        # JSON inside <script>: escape <, > and & so no token can close the element.
        data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
        data = data.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
        assets = resources.files("attnkit.viz")
        css = assets.joinpath("explorer.css").read_text(encoding="utf-8")
        js = assets.joinpath("explorer.js").read_text(encoding="utf-8")
        return _TEMPLATE.format(title=html.escape(self.title), css=css, js=js, data=data)

    def html(self) -> str:
        """The whole page as one string (built once, then cached)."""
        if self._html is not None:
            return self._html
        L, H, Tq, Tk = self.shape
        head_max = self._head_max()
        thumbs = np.stack([
            np.stack([_thumbnail(self.weights[li, h], self.keep(li, h), head_max[li][h])
                      for h in range(H)])
            for li in range(L)
        ])
        thumbs_b64 = _deflate(thumbs.tobytes())
        masks = None
        if self.mask is not None:
            Lm, Hm = self.mask.shape[:2]
            masks = {"L": Lm, "H": Hm, "data": [
                [_deflate(np.packbits(self.mask[li, h].reshape(-1)).tobytes())
                 for h in range(Hm)] for li in range(Lm)
            ]}
        if self.precision == "float16":
            page = self._page(self._payload(None, head_max, thumbs_b64, masks))
            self._check_size(page, None)
            self._html, self._levels = page, None
            return page
        for levels in self._levels_to_try():
            page = self._page(self._payload(levels, head_max, thumbs_b64, masks))
            if self.max_bytes is None or len(page.encode("utf-8")) <= self.max_bytes:
                self._html, self._levels = page, levels
                return page
        self._check_size(page, LEVELS[-1])
        raise AssertionError("unreachable: _check_size raises")  # pragma: no cover

    def _levels_to_try(self) -> list[int]:
        """LEVELS from the first one that an estimate says fits ``max_bytes``.

        The estimate deflates a sample of heads (one per layer) at each level and scales
        by the head count, so a page that fits at 8 bits is encoded once.
        """
        L, H, _, _ = self.shape
        if self.max_bytes is None or L * H <= 4:
            return list(LEVELS)
        sample = [(li, (li * 5) % H) for li in range(L)]
        for i, levels in enumerate(LEVELS):
            size = 0
            for li, h in sample:
                w = self.weights[li, h]
                k = self.keep(li, h)
                if k is not None:
                    w = np.where(k, w, 0.0)
                codes, _ = _quantize(w, levels)
                size += len(_deflate(codes.tobytes(), rle=True))
            estimate = size / len(sample) * L * H
            if estimate <= 0.95 * self.max_bytes:
                return list(LEVELS[i:])
        return [LEVELS[-1]]

    def _check_size(self, page: str, levels: int | None) -> None:
        size = len(page.encode("utf-8"))
        if self.max_bytes is not None and size > self.max_bytes:
            how = "float16" if levels is None else f"{levels} steps per row"
            raise ValueError(
                f"the page would be {size / 1e6:.1f} MB ({how}), over max_bytes = "
                f"{self.max_bytes / 1e6:.1f} MB: show fewer layers (layers=...), use "
                "precision='uint8', or pass max_bytes=None"
            )

    @property
    def nbytes(self) -> int:
        """Size of the page in bytes (UTF-8)."""
        return len(self.html().encode("utf-8"))

    def save(self, path: PathLike) -> Path:
        """Write the page to ``path`` (parent folders created); returns the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html(), encoding="utf-8")
        return path

    def _repr_html_(self) -> str:
        # An iframe keeps the page's script, style and keyboard handling to itself.
        return (f'<iframe class="attnkit-explorer" srcdoc="{html.escape(self.html())}" '
                'style="width:100%;height:640px;border:1px solid #ddd" '
                f'title="{html.escape(self.title)}"></iframe>')

    # -- weights on disk -----------------------------------------------------------------------
    def save_npz(self, path: PathLike, *, dtype: Any = np.float16) -> Path:
        """Save the inputs (weights as ``dtype``, tokens, mask, kv heads, layer numbers,
        title) to a compressed ``.npz`` that :func:`load_npz` and ``attnkit view FILE.npz``
        read. float16 (the default) halves the file and keeps more precision than the page.
        """
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, Any] = {
            "format": np.array(NPZ_FORMAT),
            "weights": self.weights.astype(dtype),
            "q_tokens": np.array(self.q_tokens, dtype=str),
            "k_tokens": np.array(self.k_tokens, dtype=str),
            "kv_heads": np.array(self.kv_heads),
            "layers": np.array(self.layer_ids, dtype=np.int64),
            "title": np.array(self.title),
        }
        if self.mask is not None:
            arrays["mask"] = self.mask
        with path.open("wb") as f:  # a file object: savez would add ".npz" to other names
            np.savez_compressed(f, **arrays)
        return path


def explore(
    weights: Any,
    tokens: Sequence[Any] | None = None,
    *,
    k_tokens: Sequence[Any] | None = None,
    mask: Any = None,
    kv_heads: int | None = None,
    batch: int = 0,
    layers: Sequence[int] | None = None,
    title: str = "attention",
    precision: str = "uint8",
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    view: str = "auto",
    path: PathLike | None = None,
) -> Explorer:
    """An interactive view of attention weights, as one self-contained HTML page.

    Args:
        weights: attention weights, NumPy or torch, as one of
            ``(Tq, Tk)``; ``(H, Tq, Tk)`` (one layer, e.g. ``need_weights`` output ``w[0]``);
            ``(L, H, Tq, Tk)``; ``(L, B, H, Tq, Tk)``; or a list/tuple with one
            ``(H, Tq, Tk)`` or ``(B, H, Tq, Tk)`` per layer (a transformers model's
            ``output_attentions``). Weights are >= 0 and finite.
        tokens: the ``Tq`` query tokens (default: positions).
        k_tokens: the ``Tk`` key tokens (default: ``tokens`` when ``Tq == Tk``, else
            positions).
        mask: bool, **True = may attend**, broadcastable to ``(L, H, Tq, Tk)`` (e.g. a
            ``(Tq, Tk)`` causal mask or a ``(Tk,)`` padding mask). Masked cells are drawn
            as grey stripes, unlike allowed cells of weight ~0, and read back as 0.
        kv_heads: ``Hkv``, the key/value heads (GQA/MQA): query head ``h`` uses key/value
            head ``h // (H // Hkv)``, and the overview groups heads that way.
        batch: which batch element to show when the weights have a batch axis.
        layers: which layers to keep (indices into the layer axis; the page names them).
        title: page title.
        precision: ``"uint8"`` (``levels`` steps of each row's maximum, see the module
            docstring) or ``"float16"``.
        max_bytes: the page's size limit (default 20 MB). uint8 pages use fewer steps per
            row until they fit; a page that cannot fit raises ``ValueError``. None: none.
        view: the view shown first: ``"lines"``, ``"matrix"``, or ``"auto"`` (lines up to
            128 tokens, else the matrix).
        path: when given, the page is also written there.

    Returns:
        An :class:`Explorer`: ``save(path)``, ``html()``, ``save_npz(path)``, and inline
        display in Jupyter.
    """
    w = _stack_layers(weights, batch)
    L, H, Tq, Tk = w.shape
    keep = None if mask is None else _mask_4d(mask, (L, H, Tq, Tk))
    layer_ids = tuple(range(L))
    if layers is not None:
        idx = [int(i) for i in layers]
        bad = [i for i in idx if not -L <= i < L]
        if bad or not idx:
            raise ValueError(f"layers {idx} out of range for {L} layers")
        idx = [i % L for i in idx]
        w = w[idx]
        if keep is not None and keep.shape[0] > 1:
            keep = keep[idx]
        layer_ids = tuple(idx)
    q = _tokens(tokens, Tq, "tokens")
    if k_tokens is None:
        k = q if (tokens is not None and Tq == Tk) else _tokens(None, Tk, "k_tokens")
    else:
        k = _tokens(k_tokens, Tk, "k_tokens")
    ex = Explorer(np.ascontiguousarray(w), q, k, mask=keep, kv_heads=kv_heads,
                  layer_ids=layer_ids, title=title, precision=precision,
                  max_bytes=max_bytes, view=view)
    if path is not None:
        ex.save(path)
    return ex


def load_npz(path: PathLike, **options: Any) -> Explorer:
    """An :class:`Explorer` from an ``.npz`` file: one written by
    :meth:`Explorer.save_npz`, or any ``np.savez`` file with a ``weights`` array (any layout
    :func:`explore` takes, ``batch`` 0) and optionally ``tokens`` (or ``q_tokens`` and
    ``k_tokens``), ``mask``, ``kv_heads``, ``layers``, ``title``.

    ``options`` go to :func:`explore` and override what the file holds.
    """
    if not zipfile.is_zipfile(path):  # np.load would try (and refuse) to unpickle it
        raise ValueError(f"{path}: not a readable .npz file (not a zip archive)")
    with np.load(path, allow_pickle=False) as f:
        if "weights" not in f.files:
            raise ValueError(f"{path}: no 'weights' array (it holds {sorted(f.files)})")
        args: dict[str, Any] = {"weights": f["weights"]}
        if "q_tokens" in f.files:
            args["tokens"] = [str(t) for t in f["q_tokens"]]
        elif "tokens" in f.files:
            args["tokens"] = [str(t) for t in f["tokens"]]
        if "k_tokens" in f.files:
            args["k_tokens"] = [str(t) for t in f["k_tokens"]]
        if "mask" in f.files:
            args["mask"] = f["mask"].astype(bool)
        if "kv_heads" in f.files:
            args["kv_heads"] = int(f["kv_heads"])
        if "title" in f.files:
            args["title"] = str(f["title"])
        saved_layers = [int(i) for i in f["layers"]] if "layers" in f.files else None
    if args["weights"].dtype != np.float32:
        args["weights"] = args["weights"].astype(np.float32)
    args.setdefault("title", Path(path).stem)
    args.update(options)
    ex = explore(**args)
    if saved_layers is not None and "layers" not in options and len(saved_layers) == ex.shape[0]:
        ex.layer_ids = tuple(saved_layers)
    return ex


# -- the `attnkit view` command --------------------------------------------------------------
def _default_model_loader() -> ModelLoader:
    """``attnkit.integrations.transformers.attentions_for_text``, when that front end is
    installed."""
    try:
        mod = importlib.import_module("attnkit.integrations.transformers")
        return mod.attentions_for_text
    except (ImportError, AttributeError) as err:
        raise ValueError(
            "viewing a model needs attnkit's transformers front end "
            f"(attnkit.integrations.transformers.attentions_for_text: {err}); "
            "save the weights with Explorer.save_npz and view the .npz instead"
        ) from None


def _page_name(source: str) -> str:
    stem = Path(source.rstrip("/\\")).name
    stem = stem[:-4] if stem.endswith(".npz") else stem
    return (re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "attention") + ".html"


def view_file(
    source: PathLike,
    out: PathLike = "attnkit-out",
    *,
    text: str | None = None,
    model_loader: ModelLoader | None = None,
    **options: Any,
) -> Path:
    """Write the explorer page of a saved ``.npz`` file, or of a model run on ``text``.

    Args:
        source: an ``.npz`` file (see :func:`load_npz`), or a model name or folder.
        out: folder for the page, named after ``source`` (``weights.npz`` ->
            ``weights.html``).
        text: the input the model reads (models only).
        model_loader: ``loader(source, text) -> (attentions, tokens)`` for a model
            (default: ``attnkit.integrations.transformers.attentions_for_text``).
        options: passed to :func:`explore` (``precision``, ``layers``, ``max_bytes``...).

    Returns:
        The path of the page.

    Raises:
        ValueError: a source that is neither a readable ``.npz`` nor a loadable model, or a
            model without ``text``.
    """
    src = os.fspath(source)
    if src.endswith(".npz") or os.path.isfile(src):
        if not os.path.isfile(src):
            raise ValueError(f"{src}: no such file")
        if text is not None:
            raise ValueError("--text is for a model; a .npz file holds its tokens")
        try:
            ex = load_npz(src, **options)
        except (OSError, zlib.error) as err:
            raise ValueError(f"{src}: not a readable .npz file ({err})") from None
        except ValueError as err:
            raise ValueError(str(err) if src in str(err) else f"{src}: {err}") from None
    else:
        if text is None:
            raise ValueError(f"{src} is not a .npz file, so it names a model, and a model "
                             "needs --text")
        loader = model_loader or _default_model_loader()
        weights, tokens = loader(src, text)
        options.setdefault("title", f"{src}: {text[:60]}")
        ex = explore(weights, tokens, **options)
    return ex.save(Path(out) / _page_name(src))


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``attnkit view``, added to ``parser``."""
    parser.add_argument("source", metavar="MODEL_OR_PATH",
                        help="a .npz of saved weights (Explorer.save_npz, or np.savez with "
                             "'weights' and 'tokens'), or a transformers model with --text")
    parser.add_argument("--text", default=None, help="the text a model reads")
    parser.add_argument("--out", default="attnkit-out",
                        help="folder for the page (default: %(default)s)")
    parser.add_argument("--precision", choices=PRECISIONS, default="uint8",
                        help="how weights are stored in the page (default: %(default)s)")
    parser.add_argument("--layers", type=int, nargs="+", default=None, metavar="N",
                        help="show only these layers")
    parser.add_argument("--max-mb", type=float, default=DEFAULT_MAX_BYTES / 1e6,
                        help="size limit of the page in MB (default: %(default)s)")


def run_view(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``attnkit view``: write the page and say where; a bad source is an argument error
    (one line, exit code 2, through ``parser.error``)."""
    if not args.max_mb > 0:
        parser.error(f"--max-mb must be positive, got {args.max_mb}")
    try:
        path = view_file(args.source, args.out, text=args.text, precision=args.precision,
                         layers=args.layers, max_bytes=int(args.max_mb * 1e6))
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    size = path.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    print(f"wrote {path} ({shown}): open it in a browser; no server needed")
    return 0


def view_main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnkit.viz.explorer MODEL_OR_PATH ...``, the same as ``attnkit view``."""
    parser = argparse.ArgumentParser(
        prog="attnkit view",
        description="Write a standalone HTML attention explorer for saved weights (.npz) "
                    "or for a transformers model reading --text.",
    )
    add_view_arguments(parser)
    return run_view(parser.parse_args(argv), parser)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="icon" href="data:,">
<title>{title}</title>
<style>
{css}
</style>
</head>
<body>
<div id="app" data-state="loading">
<header>
  <h1 id="title"></h1>
  <span id="facts"></span>
  <span class="keys">&larr;&rarr; head &middot; &uarr;&darr; layer &middot; l lines &middot;
  m matrix &middot; s scale</span>
</header>
<main>
  <aside id="overview" aria-label="layers and heads"></aside>
  <section id="detail">
    <div class="toolbar">
      <strong id="selection"></strong>
      <span id="group"></span>
      <span class="tabs" role="tablist">
        <button id="tab-lines" data-view="lines" role="tab">lines</button>
        <button id="tab-matrix" data-view="matrix" role="tab">matrix</button>
      </span>
      <label>scale <select id="scale">
        <option value="head">0 to head max</option>
        <option value="row">0 to row max</option>
        <option value="one">0 to 1</option>
      </select></label>
      <span id="zoom"><button data-zoom="fit">fit</button><button
        data-zoom="out">&minus;</button><button data-zoom="in">+</button></span>
      <span class="legend"><canvas id="colorbar" width="120" height="12"></canvas>
        <span id="vmax"></span><span class="swatch masked"></span>masked</span>
    </div>
    <div id="lines-view" class="view">
      <div id="lines-note" class="note"></div>
      <div id="lines-body"><ol id="qtoks" class="toks"></ol><canvas
        id="lines"></canvas><ol id="ktoks" class="toks"></ol></div>
    </div>
    <div id="matrix-view" class="view">
      <div id="mscroll"><div id="mbox"><canvas id="matrix"></canvas>
        <div id="hline" class="cross"></div><div id="vline" class="cross"></div></div></div>
    </div>
    <div id="tip"></div>
    <div id="message" class="note"></div>
  </section>
</main>
</div>
<script type="application/json" id="attnkit-data">{data}</script>
<script>
{js}
</script>
</body>
</html>
"""


if __name__ == "__main__":
    sys.exit(view_main())
