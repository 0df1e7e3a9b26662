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

The page is ``explorer.html`` with ``explorer.css``, ``explorer_data.js`` (decoding) and
``explorer.js`` (the views) inlined, filled by :mod:`attnkit.viz.explorer_data`; the
``attnkit view`` command lives in :mod:`attnkit.viz.view`.

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

import html
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .explorer_data import (
    COLORS,
    THUMB,
    encode_head,
    encode_masks,
    estimate_size,
    head_maxima,
    mask_own_size,
    page_html,
    stack_layers,
    thumbnails,
    token_labels,
)

PathLike = str | os.PathLike

__all__ = ["DEFAULT_MAX_BYTES", "LEVELS", "PRECISIONS", "Explorer", "explore", "load_npz"]

NPZ_FORMAT = "attnkit.explorer/1"
PRECISIONS = ("uint8", "float16")
LEVELS = (255, 127, 63, 47, 31, 23, 15)  # steps per row max, tried in order vs max_bytes
LINES_MAX_TOKENS = 1024  # the lines view draws up to this many tokens per side
DEFAULT_MAX_BYTES = 20_000_000


@dataclass(eq=False)
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
            "headMax": head_max, "colors": list(COLORS),
            "thumb": {"rows": min(Tq, THUMB), "cols": min(Tk, THUMB), "data": thumbs},
            "mask": masks,
            "heads": [[encode_head(self.weights[li, h], self.keep(li, h), levels)
                       for h in range(H)] for li in range(L)],
        }

    def _page(self, payload: dict[str, Any]) -> str:
        return page_html(payload, self.title)

    def html(self) -> str:
        """The whole page as one string (built once, then cached)."""
        if self._html is not None:
            return self._html
        head_max = head_maxima(self.weights, self.keep)
        thumbs_b64 = thumbnails(self.weights, self.keep, head_max)
        masks = encode_masks(self.mask)
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
        for i, levels in enumerate(LEVELS):
            if estimate_size(self.weights, self.keep, levels) <= 0.95 * self.max_bytes:
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
    w = stack_layers(weights, batch)
    L, H, Tq, Tk = w.shape
    keep = None if mask is None else mask_own_size(mask, (L, H, Tq, Tk))
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
    q = token_labels(tokens, Tq, "tokens")
    if k_tokens is None:
        k = q if (tokens is not None and Tq == Tk) else token_labels(None, Tk, "k_tokens")
    else:
        k = token_labels(k_tokens, Tk, "k_tokens")
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
