"""Attention heatmaps with matplotlib, headless: figures are built as
:class:`matplotlib.figure.Figure` objects directly, so no pyplot, no GUI backend and no
display are involved. Saving a figure is the ``path=`` argument away.

Shape legend::

    L  layers    H  heads    Tq  query length (rows)    Tk  key length (columns)

Weights may be NumPy arrays or torch tensors (read through ``.detach().cpu()``; torch is
never imported here). Masks follow the library meaning: **True = may attend**. Cells a mask
excludes are drawn grey and hatched, so they never look like cells that were allowed and
merely got a weight near 0 (which the ``Reds`` colormap draws white).
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.collections import PatchCollection
from matplotlib.colors import Colormap
from matplotlib.figure import Figure
from matplotlib.image import AxesImage
from matplotlib.patches import Patch, Rectangle

__all__ = [
    "MASKED_COLOR", "MASKED_GID", "NotebookFigure", "plot_attention", "save_figure",
    "show_heatmaps",
]

MASKED_COLOR = "#c8c8c8"  # fill of excluded cells: grey, unlike the white low end of "Reds"
MASKED_HATCH_COLOR = "#7a7a7a"
MASKED_GID = "masked-cells"  # gid of the hatch overlay, so tests and tools can find it

PathLike = str | os.PathLike


class NotebookFigure(Figure):
    """A :class:`~matplotlib.figure.Figure` that a notebook shows inline.

    Built without pyplot, a plain ``Figure`` has no picture for Jupyter to show until
    matplotlib's inline backend registers one, which it does only once pyplot is imported:
    a cell that ends with ``plot_attention(...)`` would print ``<Figure size ...>``. This
    subclass renders itself as PNG (``_repr_png_``), so the figure appears under the cell
    whatever the backend; everywhere else it is the ``Figure`` it derives from.
    """

    def _repr_png_(self) -> bytes:
        """The figure as PNG bytes, at its own dpi (what IPython displays)."""
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()


def to_numpy(x: Any, name: str = "array") -> np.ndarray:
    """A float64 NumPy array (bool stays bool) from an array-like or a torch tensor,
    without importing torch.

    bfloat16/float16 tensors are widened to float32 first: NumPy has no bfloat16.
    """
    if hasattr(x, "detach") and hasattr(x, "cpu"):
        t = x.detach().cpu()
        if t.dtype.is_floating_point and t.dtype.itemsize < 4:
            t = t.float()
        x = t.numpy()
    arr = np.asarray(x)
    if arr.dtype == np.bool_:
        return arr
    if not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must hold real numbers, got dtype {arr.dtype}")
    return arr.astype(np.float64, copy=False)


def save_figure(fig: Figure, path: PathLike, *, dpi: int = 150) -> str:
    """Write ``fig`` to ``path`` (format from the suffix), creating parent folders.

    Returns:
        The path written, as a string.
    """
    path = os.fspath(path)
    parent = os.path.dirname(path)
    if parent:
        os.makedirs(parent, exist_ok=True)
    fig.savefig(path, dpi=dpi)
    return path


def _color_limits(values: np.ndarray, keep: np.ndarray | None, vmax: float | None) -> float:
    """Shared upper colour limit: the largest weight on an allowed cell (1 if none)."""
    if vmax is not None:
        return float(vmax)
    shown = values if keep is None else values[keep]
    shown = shown[np.isfinite(shown)]
    top = float(shown.max()) if shown.size else 0.0
    return top if top > 0 else 1.0


def show_heatmaps(
    matrices: Any,
    xlabel: str,
    ylabel: str,
    titles: Sequence[str] | None = None,
    figsize: tuple[float, float] = (2.5, 2.5),
    cmap: str | Colormap = "Reds",
    *,
    cbar_label: str | None = "weight",
    path: PathLike | None = None,
) -> Figure:
    """d2l's heatmap grid: one panel per ``matrices[i, j]``.

    Args:
        matrices: ``(rows, cols, Tq, Tk)`` array or tensor.
        xlabel: label under the bottom row (the keys, usually).
        ylabel: label left of the first column (the queries, usually).
        titles: one title per column.
        figsize: size of the whole figure in inches (d2l's meaning).
        cmap: a matplotlib colormap.
        cbar_label: what the colours measure, written along the colorbar (None: no label).
        path: when given, the figure is also written there (PNG, SVG, PDF by suffix).

    Returns:
        The Figure; ``fig.axes`` holds the ``rows * cols`` panels row by row, then the
        colorbar. Unlike d2l, all panels share one colour scale, so the colorbar is true for
        every panel.
    """
    m = to_numpy(matrices, "matrices")
    if m.ndim != 4:
        raise ValueError(f"matrices must be (rows, cols, Tq, Tk), got shape {m.shape}")
    rows, cols = m.shape[:2]
    if rows == 0 or cols == 0:
        raise ValueError(f"matrices has no panel to draw: shape {m.shape}")
    if titles is not None and len(titles) != cols:
        raise ValueError(f"titles must give one title per column ({cols}), got {len(titles)}")
    fig = NotebookFigure(figsize=figsize, layout="constrained")
    axes = fig.subplots(rows, cols, sharex=True, sharey=True, squeeze=False)
    vmax = _color_limits(m, None, None)
    image = None
    for i in range(rows):
        for j in range(cols):
            ax = axes[i, j]
            image = ax.imshow(m[i, j], cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto")
            if i == rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles is not None:
                ax.set_title(titles[j])
    fig.colorbar(image, ax=axes, shrink=0.6, pad=0.01, fraction=max(0.03, 0.15 / cols),
                 label=cbar_label)
    if path is not None:
        save_figure(fig, path)
    return fig


def _runs(row: np.ndarray) -> list[tuple[int, int]]:
    """``(start, length)`` of every run of True in a 1-D bool array."""
    padded = np.concatenate(([False], row, [False]))
    edges = np.flatnonzero(padded[1:] != padded[:-1])
    return [(int(s), int(e - s)) for s, e in zip(edges[::2], edges[1::2])]


def _hatch_masked(ax: Any, excluded: np.ndarray) -> PatchCollection | None:
    """Overlay hatched grey rectangles on excluded cells, one rectangle per run in a row."""
    patches = [
        Rectangle((start - 0.5, i - 0.5), length, 1.0)
        for i, row in enumerate(excluded)
        for start, length in _runs(row)
    ]
    if not patches:
        return None
    coll = PatchCollection(
        patches, facecolor="none", edgecolor=MASKED_HATCH_COLOR, hatch="///", linewidth=0.0
    )
    coll.set_gid(MASKED_GID)
    ax.add_collection(coll)
    return coll


def _set_token_ticks(ax: Any, axis: str, tokens: Sequence[str] | None, n: int) -> None:
    set_ticks = ax.set_xticks if axis == "x" else ax.set_yticks
    if tokens is None:
        # Token indices: whole numbers from 0, at most ~8 of them (a locator would put
        # ticks like -0.45 ... 0.45 on a single row).
        step = next(s for s in (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10**9)
                    if n <= 8 * s)
        set_ticks(range(0, n, step))
        return
    # Label every token up to 40 of them, then every k-th so labels never overlap.
    step = max(1, int(np.ceil(n / 40)))
    pos = list(range(0, n, step))
    labels = [str(tokens[p]) for p in pos]
    longest = max((len(s) for s in labels), default=0)
    size = 8 if n <= 20 else 6
    if axis == "x":
        set_ticks(pos, labels, fontsize=size, rotation=90 if longest > 2 else 0)
    else:
        set_ticks(pos, labels, fontsize=size)


def _module_weights(obj: Any) -> tuple[Any, tuple[str, ...] | None]:
    """``(weights, panel axis names)`` of a module keeping d2l's ``attention_weights``
    (read as they are laid out), else ``(obj, None)``."""
    if hasattr(obj, "shape"):  # an array or a tensor
        return obj, None
    inner = getattr(obj, "attention", None)
    if hasattr(inner, "attention_weights") and hasattr(obj, "num_heads"):  # d2l's MHA
        w, H = inner.attention_weights, int(obj.num_heads)
        if w is None:
            raise ValueError("the module has no attention_weights yet: run it once first")
        BH, Tq, Tk = w.shape  # heads folded into the batch, example b's head h at b * H + h
        return w.reshape(BH // H, H, Tq, Tk), ("batch", "head")
    if hasattr(obj, "attention_weights"):
        if obj.attention_weights is None:
            raise ValueError("the module has no attention_weights yet: run it once first")
        return obj.attention_weights, ("batch",)  # (B, Tq, Tk)
    return obj, None


def _panel_names(panels: str | Sequence[str] | None, layered: bool) -> tuple[str, ...]:
    """The words of the default titles: ``(row, column)`` for 4-D input, one word else."""
    if panels is None:
        return ("layer", "head") if layered else ("head",)
    names = (panels,) if isinstance(panels, str) else tuple(panels)
    if len(names) != (2 if layered else 1) or not all(isinstance(n, str) for n in names):
        want = "two words, e.g. ('layer', 'head')" if layered else "one word, e.g. 'batch'"
        raise ValueError(f"panels must be {want} for weights of this shape, got {panels!r}")
    return names


def plot_attention(
    weights: Any,
    *,
    q_tokens: Sequence[str] | None = None,
    k_tokens: Sequence[str] | None = None,
    mask: Any = None,
    heads: int | Sequence[int] | None = None,
    titles: str | Sequence[str] | None = None,
    xlabel: str = "keys",
    ylabel: str = "queries",
    cmap: str | Colormap = "Reds",
    ncols: int | None = None,
    vmax: float | None = None,
    panel_size: float | None = None,
    panels: str | Sequence[str] | None = None,
    path: PathLike | None = None,
) -> Figure:
    """Attention weights as heatmaps, one panel per head (or per layer x head).

    Args:
        weights: ``(Tq, Tk)``, ``(H, Tq, Tk)`` or ``(L, H, Tq, Tk)``, array or tensor.
            Pick one batch element before plotting (``w[0]``), or say what the panel axes
            are with ``panels``. A module that keeps d2l's ``attention_weights`` is read
            directly: ``DotProductAttention`` / ``AdditiveAttention`` ``(B, Tq, Tk)`` as
            one panel per batch element, d2l's ``MultiHeadAttention`` ``(B * H, Tq, Tk)``
            as batch rows x head columns.
        q_tokens: ``Tq`` labels for the rows.
        k_tokens: ``Tk`` labels for the columns.
        mask: bool, **True = may attend**, broadcastable to ``weights`` (e.g. a
            ``(Tq, Tk)`` causal mask for every head). Excluded cells are drawn grey and
            hatched, distinct from allowed cells with weight ~0.
        heads: index or indices along the head axis to show (default: all).
        titles: one per panel (a string for a single panel); default ``head h`` /
            ``layer l, head h``.
        xlabel, ylabel: axis labels on the outer panels.
        cmap: a matplotlib colormap (sequential, low = light).
        ncols: panels per row for ``(H, Tq, Tk)`` input (default up to 4); layers always
            make rows.
        vmax: top of the shared colour scale (default: the largest allowed weight).
        panel_size: inches per panel side (default from ``Tq``/``Tk``).
        panels: what the panel axes are, for the default titles: one word for
            ``(N, Tq, Tk)`` input (default ``"head"``; ``"batch"`` for d2l's
            ``attention_weights``), two for ``(N, M, Tq, Tk)`` (default
            ``("layer", "head")``).
        path: when given, the figure is also written there.

    Returns:
        The Figure. Each panel's image holds a ``numpy.ma.MaskedArray`` whose mask is the
        excluded cells, and an overlay collection with gid ``"masked-cells"`` hatches them.
    """
    weights, read_as = _module_weights(weights)
    panels = read_as if panels is None else panels
    w = to_numpy(weights, "weights")
    if w.ndim not in (2, 3, 4):
        raise ValueError(
            f"weights must be (Tq, Tk), (H, Tq, Tk) or (L, H, Tq, Tk), got shape {w.shape}"
        )
    keep = None
    if mask is not None:
        m = to_numpy(mask, "mask")
        if m.dtype != np.bool_:
            raise TypeError(f"mask must be bool (True = may attend), got dtype {m.dtype}")
        try:
            keep = np.broadcast_to(m, w.shape)
        except ValueError:
            raise ValueError(
                f"mask of shape {m.shape} is not broadcastable to weights {w.shape}"
            ) from None
    layered = w.ndim == 4
    w4 = w.reshape((1,) * (4 - w.ndim) + w.shape)  # (L, H, Tq, Tk)
    k4 = None if keep is None else keep.reshape(w4.shape)
    if heads is not None:
        if w.ndim == 2:
            raise ValueError(f"heads= needs a head axis; weights have shape {w.shape}")
        idx = [heads] if isinstance(heads, (int, np.integer)) else list(heads)
        H = w4.shape[1]
        bad = [h for h in idx if not -H <= h < H]
        if bad or not idx:
            raise ValueError(f"heads {idx} out of range for {H} heads (weights {w.shape})")
        w4 = w4[:, idx]
        k4 = None if k4 is None else k4[:, idx]
        head_ids = [h % H for h in idx]
    else:
        head_ids = list(range(w4.shape[1]))
    L, H, Tq, Tk = w4.shape
    if Tq == 0 or Tk == 0:
        raise ValueError(f"nothing to draw: weights have shape {w.shape}")
    for name, toks, n in (("q_tokens", q_tokens, Tq), ("k_tokens", k_tokens, Tk)):
        if toks is not None and len(toks) != n:
            raise ValueError(f"{name} has {len(toks)} labels, weights have {n} there")

    axis_names = _panel_names(panels, layered)
    # Panels in reading order, with their default titles.
    drawn: list[tuple[np.ndarray, np.ndarray | None, str]] = []
    for li in range(L):
        for hi, h in enumerate(head_ids):
            default = (f"{axis_names[0]} {li}, {axis_names[1]} {h}" if layered
                       else f"{axis_names[-1]} {h}")
            drawn.append((w4[li, hi], None if k4 is None else k4[li, hi], default))
    n_panels = len(drawn)
    if titles is None:
        names = [p[2] for p in drawn] if n_panels > 1 else [""]
    elif isinstance(titles, str):
        names = [titles] * n_panels if n_panels == 1 else None
        if names is None:
            raise ValueError(f"titles must be a list of {n_panels} strings, got one string")
    else:
        names = list(titles)
        if len(names) != n_panels:
            raise ValueError(f"titles has {len(names)} entries for {n_panels} panels")
    if layered:
        nrows, ncol = L, H
    else:
        ncol = min(n_panels, ncols if ncols else 4)
        if ncol < 1:
            raise ValueError(f"ncols must be >= 1, got {ncols}")
        nrows = -(-n_panels // ncol)

    side = panel_size or float(np.clip(0.22 * max(Tq, Tk) + 1.2, 2.0, 5.0))
    aspect = float(np.clip(Tq / Tk, 0.25, 4.0))
    fig = NotebookFigure(figsize=(ncol * side + 0.9, nrows * side * aspect + 0.6),
                         layout="constrained")
    axes = fig.subplots(nrows, ncol, squeeze=False, sharex=True, sharey=True)
    top = _color_limits(w4, k4, vmax)
    base = cmap if isinstance(cmap, Colormap) else None
    if base is None:
        from matplotlib import colormaps

        base = colormaps[cmap]
    cm = base.with_extremes(bad=MASKED_COLOR)

    image: AxesImage | None = None
    any_masked = False
    for p, (ax, (pw, pk, _)) in enumerate(zip(axes.flat, drawn)):
        excluded = np.zeros(pw.shape, dtype=bool) if pk is None else ~pk
        any_masked |= bool(excluded.any())
        data = np.ma.masked_array(pw, mask=excluded)
        image = ax.imshow(data, cmap=cm, vmin=0.0, vmax=top, aspect="auto",
                          interpolation="nearest")
        _hatch_masked(ax, excluded)
        if names[p]:
            ax.set_title(names[p], fontsize=9)
        row, col = divmod(p, ncol)
        if row == nrows - 1 or p + ncol >= n_panels:
            ax.set_xlabel(xlabel)
            ax.tick_params(axis="x", labelbottom=True)
        if col == 0:
            ax.set_ylabel(ylabel)
        _set_token_ticks(ax, "x", k_tokens, Tk)
        _set_token_ticks(ax, "y", q_tokens, Tq)
    for ax in list(axes.flat)[n_panels:]:
        ax.set_visible(False)
    fig.colorbar(image, ax=axes, shrink=0.8 if nrows > 1 else 0.9, pad=0.02,
                 fraction=max(0.03, 0.15 / ncol),
                 label="weight")
    if any_masked:
        fig.legend(
            handles=[Patch(facecolor=MASKED_COLOR, edgecolor=MASKED_HATCH_COLOR, hatch="///",
                           label="masked (may not attend)")],
            loc="outside lower right", fontsize=8, frameon=False,
        )
    if path is not None:
        save_figure(fig, path)
    return fig
