"""attnkit.viz: the heatmap functions, checked on the figures' data (not by eye)."""

from __future__ import annotations

import matplotlib.colors as mcolors
import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import attnkit.numpy as an
from attnkit.viz import MASKED_COLOR, MASKED_GID, plot_attention, show_heatmaps


def heat_axes(fig: Figure) -> list:
    """The panels (axes holding a heatmap), in reading order; the colorbar excluded."""
    return [ax for ax in fig.axes if ax.images and ax.get_visible()]


def covered_cells(ax, shape: tuple[int, int]) -> np.ndarray:
    """Cells the hatch overlay of ``ax`` covers, rebuilt from its rectangles' corners."""
    cov = np.zeros(shape, dtype=int)
    overlays = [c for c in ax.collections if c.get_gid() == MASKED_GID]
    for coll in overlays:
        for path in coll.get_paths():
            (x0, y0), (x1, y1) = path.vertices.min(0), path.vertices.max(0)
            cov[round(y0 + 0.5):round(y1 + 0.5), round(x0 + 0.5):round(x1 + 0.5)] += 1
    return cov


# -- show_heatmaps (d2l's signature) ---------------------------------------------------------
@pytest.mark.parametrize("rows, cols", [(1, 1), (2, 3)])
def test_show_heatmaps_grid_titles_labels(rows, cols, rng, tmp_path, check_png):
    m = rng.uniform(size=(rows, cols, 4, 6))
    titles = [f"col {j}" for j in range(cols)]
    path = tmp_path / "grid.png"
    fig = show_heatmaps(m, xlabel="Keys", ylabel="Queries", titles=titles, path=path)
    assert isinstance(fig, Figure)
    axes = heat_axes(fig)
    assert len(axes) == rows * cols
    for idx, ax in enumerate(axes):
        i, j = divmod(idx, cols)
        assert ax.get_title() == titles[j]
        np.testing.assert_array_equal(ax.images[0].get_array(), m[i, j])
        assert ax.get_xlabel() == ("Keys" if i == rows - 1 else "")
        assert ax.get_ylabel() == ("Queries" if j == 0 else "")
    # One colour scale for all panels, so the colorbar tells the truth about each.
    limits = {ax.images[0].get_clim() for ax in axes}
    assert limits == {(0.0, float(m.max()))}
    check_png(path)


def test_show_heatmaps_accepts_torch_tensor():
    torch = pytest.importorskip("torch", reason="torch input needs torch")
    t = torch.rand(1, 2, 3, 5, dtype=torch.bfloat16, requires_grad=False)
    fig = show_heatmaps(t, "k", "q")
    got = heat_axes(fig)[1].images[0].get_array()
    np.testing.assert_array_equal(got, t[0, 1].float().numpy())


@pytest.mark.parametrize("shape", [(3, 4), (2, 3, 4), (1, 1, 2, 3, 4), (0, 1, 2, 2)])
def test_show_heatmaps_rejects_bad_shape(shape):
    with pytest.raises(ValueError, match=r"\(rows, cols, Tq, Tk\)|no panel"):
        show_heatmaps(np.zeros(shape), "k", "q")


def test_show_heatmaps_title_count_checked():
    with pytest.raises(ValueError, match="one title per column"):
        show_heatmaps(np.zeros((1, 2, 3, 3)), "k", "q", titles=["only one"])


# -- plot_attention: masked cells ------------------------------------------------------------
def _case(name: str, rng: np.random.Generator):
    """(weights (H, Tq, Tk), keep mask (Tq, Tk) or (H, Tq, Tk)) for a masking case."""
    if name == "causal Tq<Tk":
        keep = an.causal_mask(3, 7)
    elif name == "causal Tq>Tk":
        keep = an.causal_mask(7, 3)  # the first rows see nothing: fully masked rows
    elif name == "padding":
        keep = np.broadcast_to(an.sequence_mask(np.array([4]), 6), (5, 6))
    elif name == "window":
        keep = an.window_mask(6, 6, 1, 1)
    elif name == "per-head":
        keep = rng.uniform(size=(2, 5, 6)) < 0.5
    else:
        raise AssertionError(name)
    Tq, Tk = keep.shape[-2:]
    w = an.masked_softmax(rng.normal(size=(2, Tq, Tk)), mask=keep)
    return w, keep


@pytest.mark.parametrize("case", ["causal Tq<Tk", "causal Tq>Tk", "padding", "window",
                                  "per-head"])
def test_plot_attention_marks_exactly_the_masked_cells(case, rng):
    w, keep = _case(case, rng)
    fig = plot_attention(w, mask=keep)
    axes = heat_axes(fig)
    assert len(axes) == 2
    full = np.broadcast_to(keep, w.shape)
    for h, ax in enumerate(axes):
        data = ax.images[0].get_array()
        assert isinstance(data, np.ma.MaskedArray)
        np.testing.assert_array_equal(np.ma.getmaskarray(data), ~full[h])
        np.testing.assert_array_equal(data.data, w[h])
        # The hatch overlay covers each excluded cell exactly once and nothing else.
        np.testing.assert_array_equal(covered_cells(ax, w.shape[1:]), (~full[h]).astype(int))
    assert any(t.get_text().startswith("masked") for leg in fig.legends for t in leg.texts)


def test_plot_attention_without_mask_marks_nothing(rng):
    w = an.softmax(rng.normal(size=(4, 5)))
    fig = plot_attention(w)
    (ax,) = heat_axes(fig)
    assert not np.ma.getmaskarray(ax.images[0].get_array()).any()
    assert not [c for c in ax.collections if c.get_gid() == MASKED_GID]
    assert not fig.legends


def test_masked_cell_drawn_unlike_a_zero_weight_cell():
    """An allowed cell with weight exactly 0 and an excluded cell must render differently."""
    w = np.array([[1.0, 0.0, 0.0]])
    keep = np.array([[True, True, False]])
    fig = plot_attention(w, mask=keep, panel_size=3.0)
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    pixels = np.asarray(canvas.buffer_rgba())[..., :3].astype(int)
    (ax,) = heat_axes(fig)
    height = pixels.shape[0]

    def colour_at(x: float, y: float) -> np.ndarray:
        # Sample a little off the cell centre, between hatch lines as well as on them.
        px, py = ax.transData.transform((x + 0.1, y + 0.1))
        return pixels[int(height - py), int(px)]

    zero, masked = colour_at(1, 0), colour_at(2, 0)
    assert np.abs(zero - masked).max() > 30, (zero, masked)
    # The zero cell has the colormap's low colour; the masked one is the grey fill or hatch.
    low = np.array(mcolors.to_rgb(ax.images[0].cmap(0.0))) * 255
    assert np.abs(zero - low).max() < 8
    grey = np.array(mcolors.to_rgb(MASKED_COLOR)) * 255
    assert np.abs(masked - grey).max() < 8 or masked.max() - masked.min() < 8


# -- plot_attention: layout, labels, inputs --------------------------------------------------
def test_plot_attention_layers_by_heads_titles_and_head_selection(rng):
    w = rng.uniform(size=(2, 4, 3, 5))  # (L, H, Tq, Tk)
    fig = plot_attention(w, heads=[3, 1])
    axes = heat_axes(fig)
    assert [ax.get_title() for ax in axes] == [
        "layer 0, head 3", "layer 0, head 1", "layer 1, head 3", "layer 1, head 1"
    ]
    for ax, (l, h) in zip(axes, [(0, 3), (0, 1), (1, 3), (1, 1)]):
        np.testing.assert_array_equal(ax.images[0].get_array().data, w[l, h])


def test_plot_attention_heads_wrap_into_rows(rng):
    w = rng.uniform(size=(6, 3, 3))
    fig = plot_attention(w, ncols=4)
    axes = heat_axes(fig)
    assert [ax.get_title() for ax in axes] == [f"head {h}" for h in range(6)]
    positions = {ax.get_subplotspec().rowspan.start for ax in axes}
    assert positions == {0, 1}
    # Every column that ends a stack of panels shows its key ticks (the last row has 2).
    assert all(ax.get_xlabel() == "keys" for ax in axes[2:])


@pytest.mark.parametrize("Tq, Tk", [(1, 10), (3, 4), (30, 200)])
def test_plot_attention_without_tokens_ticks_whole_token_indices(Tq, Tk, rng):
    # A single query row used to get y ticks at -0.45 ... 0.45.
    fig = plot_attention(an.softmax(rng.normal(size=(Tq, Tk))))
    (ax,) = heat_axes(fig)
    for ticks, n in ((ax.get_yticks(), Tq), (ax.get_xticks(), Tk)):
        assert ticks[0] == 0 and np.all(ticks == np.round(ticks)), ticks
        assert ticks.max() < n and 1 <= len(ticks) <= 10
    FigureCanvasAgg(fig).draw()
    assert [t.get_text() for t in ax.get_yticklabels()][0] == "0"


def test_plot_attention_names_the_panel_axes(rng):
    w = an.softmax(rng.normal(size=(2, 1, 10)))  # d2l's attention_weights: (B, Tq, Tk)
    assert [ax.get_title() for ax in heat_axes(plot_attention(w, panels="batch"))] == [
        "batch 0", "batch 1"]
    w4 = an.softmax(rng.normal(size=(2, 3, 4, 4)))
    titles = [ax.get_title() for ax in heat_axes(plot_attention(w4, panels=("batch", "head")))]
    assert titles[:2] == ["batch 0, head 0", "batch 0, head 1"] and titles[-1] == "batch 1, head 2"
    with pytest.raises(ValueError, match="two words"):
        plot_attention(w4, panels="batch")


def test_plot_attention_reads_d2l_modules_by_their_layout():
    torch = pytest.importorskip("torch")
    from attnkit.torch import d2l

    att = d2l.DotProductAttention(0.0)
    with pytest.raises(ValueError, match="run it once"):
        plot_attention(att)
    q, k = torch.randn(2, 1, 2), torch.ones(2, 10, 2)
    att(q, k, torch.randn(2, 10, 4), torch.tensor([2, 6]))
    axes = heat_axes(plot_attention(att))
    assert [ax.get_title() for ax in axes] == ["batch 0", "batch 1"]
    mha = d2l.MultiHeadAttention(8, 2, 0.0)
    x = torch.randn(3, 4, 8)
    mha(x, x, x, torch.tensor([1, 2, 4]))
    axes = heat_axes(plot_attention(mha))
    assert axes[3].get_title() == "batch 1, head 1"
    # example b's head h is row b * H + h of d2l's (B * H, Tq, Tk) weights
    np.testing.assert_array_equal(axes[3].images[0].get_array().data,
                                  mha.attention.attention_weights[3].detach().numpy())


def test_plot_attention_token_labels(rng):
    w = an.softmax(rng.normal(size=(3, 4)))
    q, k = ["a", "b", "c"], ["w", "x", "y", "zzz"]
    fig = plot_attention(w, q_tokens=q, k_tokens=k, xlabel="source", ylabel="target")
    (ax,) = heat_axes(fig)
    assert [t.get_text() for t in ax.get_xticklabels()] == k
    assert [t.get_text() for t in ax.get_yticklabels()] == q
    assert (ax.get_xlabel(), ax.get_ylabel()) == ("source", "target")


def test_plot_attention_torch_tensor_and_mask(tmp_path, check_png):
    torch = pytest.importorskip("torch", reason="torch input needs torch")
    w = torch.softmax(torch.randn(2, 4, 4, requires_grad=True), -1)  # has a grad graph
    keep = torch.tril(torch.ones(4, 4, dtype=torch.bool))
    fig = plot_attention(w, mask=keep, path=tmp_path / "t.png")
    ax = heat_axes(fig)[1]
    np.testing.assert_allclose(ax.images[0].get_array().data, w[1].detach().numpy())
    np.testing.assert_array_equal(np.ma.getmaskarray(ax.images[0].get_array()),
                                  ~keep.numpy())
    check_png(tmp_path / "t.png")


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"weights": np.zeros(5)}, ValueError, r"\(Tq, Tk\)"),
        ({"q_tokens": ["a"]}, ValueError, "q_tokens has 1 labels"),
        ({"k_tokens": ["a", "b"]}, ValueError, "k_tokens has 2 labels"),
        ({"mask": np.ones((2, 3), dtype=bool)}, ValueError, "not broadcastable"),
        ({"mask": np.ones((3, 4))}, TypeError, "must be bool"),
        ({"heads": [2]}, ValueError, "out of range"),
        ({"titles": ["a", "b", "c"]}, ValueError, "3 entries for 2 panels"),
    ],
)
def test_plot_attention_rejects_bad_input(kwargs, error, match):
    args = {"weights": np.full((2, 3, 4), 0.25)} | kwargs
    with pytest.raises(error, match=match):
        plot_attention(args.pop("weights"), **args)


def test_figures_show_themselves_in_a_notebook(rng):
    """A cell that ends with plot_attention(...) or show_heatmaps(...) shows the picture:
    IPython's display finds a PNG on the figure itself (no pyplot, no inline backend)."""
    IPython = pytest.importorskip("IPython")
    w = an.softmax(rng.standard_normal((2, 3, 4)))
    for fig in (plot_attention(w), show_heatmaps(w[None], "keys", "queries")):
        assert isinstance(fig, Figure)
        data, _ = IPython.core.formatters.DisplayFormatter().format(fig)
        assert data["image/png"][:8] == b"\x89PNG\r\n\x1a\n", sorted(data)
