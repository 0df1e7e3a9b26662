"""attnkit.viz: attention heatmaps (matplotlib, headless-safe) and the demo walk-through.

- :func:`show_heatmaps`: d2l's grid of heatmaps, ``(rows, cols, Tq, Tk)``.
- :func:`plot_attention`: token labels, one panel per head (or layer x head), masked cells
  drawn distinctly from cells with weight ~0.

Both accept NumPy arrays and torch tensors and return a :class:`matplotlib.figure.Figure`;
``path=`` writes it to a file as well. ``import attnkit.viz`` needs NumPy only; without
matplotlib the plotting names raise an ImportError that says ``pip install 'attnkit[viz]'``.

- :func:`explore`: a standalone HTML attention explorer (an :class:`Explorer`: ``save``,
  ``save_npz``, inline in Jupyter); :func:`load_npz` reads saved weights back. NumPy only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .explorer import Explorer, explore, load_npz
    from .heatmap import (
        MASKED_COLOR,
        MASKED_GID,
        plot_attention,
        save_figure,
        show_heatmaps,
        to_numpy,
    )

_EXPLORER = ("Explorer", "explore", "load_npz")

__all__ = [
    "Explorer",
    "MASKED_COLOR",
    "MASKED_GID",
    "explore",
    "load_npz",
    "plot_attention",
    "save_figure",
    "show_heatmaps",
    "to_numpy",
]


def __getattr__(name: str) -> Any:
    # matplotlib is imported on first use of a plotting name, so that `attnkit trace`
    # (attnkit.viz.trace), `import attnkit.viz` and the explorer work with NumPy alone.
    if name in _EXPLORER:
        from . import explorer

        return getattr(explorer, name)
    if name in __all__:
        from .._optional import require

        require("matplotlib", extra="viz", user=f"attnkit.viz.{name}")
        from . import heatmap

        return getattr(heatmap, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # The plotting names are public but loaded on first use: list them without matplotlib.
    return sorted(set(globals()) | set(__all__))
