"""The demo figures show what their titles claim, checked on the figures' data."""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.viz import show_heatmaps
from attnkit.viz.tour import _additive_vs_dot, _multi_head, _softmax_stability


def quiet(_: str) -> None:
    pass


def heat_axes(fig) -> list:
    return [ax for ax in fig.axes if ax.images and ax.get_visible()]


def colorbar_label(fig) -> str:
    # The colorbar is the axes without a heatmap that carries the colour scale's label.
    bars = [ax for ax in fig.axes if not ax.images and ax.get_visible()]
    assert len(bars) == 1, bars
    return bars[0].get_ylabel()


def test_softmax_figure_shows_the_naive_curve_and_where_it_fails():
    fig = _softmax_stability(quiet)
    ax = fig.axes[1]
    lines = {line.get_label(): line for line in ax.get_lines()}
    stable = lines["stable (max subtracted)"]
    naive = next(line for label, line in lines.items() if label.startswith("naive exp"))
    nan_marks = lines["naive: NaN"]
    # The naive curve is drawn as markers above the stable line, so it cannot hide under it,
    # and where it is finite it lies on the stable curve.
    assert naive.get_linestyle() == "None" and naive.get_marker() == "o"
    assert naive.get_zorder() > stable.get_zorder()
    x_naive, y_naive = (np.asarray(a) for a in naive.get_data())
    assert len(x_naive) >= 10 and np.all(np.isfinite(y_naive))
    np.testing.assert_allclose(y_naive, np.interp(x_naive, *stable.get_data()), atol=1e-2)
    # Its failures are drawn too: crosses on a row labelled NaN, past the overflow.
    x_nan, y_nan = (np.asarray(a) for a in nan_marks.get_data())
    assert len(x_nan) >= 3 and x_nan.min() > np.log(np.finfo(np.float64).max) / 4
    ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())))
    assert ticks[y_nan[0]] == "NaN"
    assert y_nan[0] > 1.0 >= stable.get_data()[1].max()


def test_additive_vs_dot_panels_say_why_they_match_and_then_differ(rng, monkeypatch):
    import attnkit.numpy as an

    seen = {"additive": [], "dot": []}  # (queries, keys, values, valid_lens) of each call
    for name, attr in (("additive", "additive_attention"),
                       ("dot", "scaled_dot_product_attention")):
        real = getattr(an, attr)

        def spy(q, k, v, *args, _real=real, _name=name, **kw):
            seen[_name].append((q, k, v, kw["valid_lens"]))
            return _real(q, k, v, *args, **kw)

        monkeypatch.setattr(an, attr, spy)
    fig = _additive_vs_dot(rng, quiet)
    # Both score functions get the very same queries, keys, values and lengths.
    assert len(seen["additive"]) == len(seen["dot"]) == 2
    for a, d in zip(seen["additive"], seen["dot"]):
        for x, y in zip(a, d):
            np.testing.assert_array_equal(x, y)
    axes = heat_axes(fig)
    titles = [ax.get_title() for ax in axes]
    assert titles == ["additive (random weights), identical keys",
                      "scaled dot-product, identical keys",
                      "additive (random weights), distinct keys",
                      "scaled dot-product, distinct keys"]
    # The title says what the panels share and what differs: the rows differ in the keys
    # (identical, then distinct), the columns in the score function.
    assert "same queries and values in all four panels" in fig.get_suptitle()
    assert "the rows differ in the keys" in fig.get_suptitle()
    assert "random" in fig.get_suptitle() and "not a sharper" in fig.get_suptitle()
    data = [ax.images[0].get_array() for ax in axes]
    # Identical keys: both score functions give the same even weights over the valid keys.
    np.testing.assert_allclose(data[0], data[1], atol=1e-12)
    np.testing.assert_allclose(data[0][0, :2], 0.5)
    np.testing.assert_allclose(data[0][1, :6], 1 / 6)
    # Distinct keys: they differ, and the figure says why the top row does not.
    assert np.abs(data[2] - data[3]).max() > 0.05
    assert "identical keys" in fig.get_suptitle() and "distinct keys" in fig.get_suptitle()


def test_multi_head_figure_says_untrained_and_labels_the_colour_bar():
    fig = _multi_head(quiet)
    assert len(heat_axes(fig)) == 5
    assert "untrained" in fig.get_suptitle() and "random" in fig.get_suptitle()
    assert colorbar_label(fig) == "attention weight"


@pytest.mark.parametrize("label, expected", [("weight", "weight"), ("score", "score"),
                                             (None, "")])
def test_show_heatmaps_colour_bar_label(label, expected, rng):
    fig = show_heatmaps(rng.uniform(size=(1, 2, 3, 3)), "keys", "queries", cbar_label=label)
    assert colorbar_label(fig) == expected


def test_show_heatmaps_colour_bar_labelled_by_default(rng):
    fig = show_heatmaps(rng.uniform(size=(1, 1, 3, 3)), "keys", "queries")
    assert colorbar_label(fig) == "weight"
