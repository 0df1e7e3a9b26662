"""Make every figure of the tutorial (docs/learn/) and the README's first heatmap.

    python docs/learn/make_figures.py                 # writes docs/learn/img/*.png
    python docs/learn/make_figures.py --out /tmp/img  # somewhere else
    python docs/learn/make_figures.py --only 03_score_functions

One function per figure, registered in FIGURES under the file name it writes. Everything is
seeded, so a rerun gives the same pictures. Figures are built without pyplot (headless).
NumPy, attnkit.numpy and matplotlib only, except 07 (attnkit.torch).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch, Rectangle

import attnkit.numpy as an

HERE = Path(__file__).resolve().parent
GREY = "#c8c8c8"  # excluded cells, as attnkit.viz draws them
HATCH = "#7a7a7a"
# Readable where the pages show the figures: a page column is about PAGE_PX wide and a
# wider image is scaled down to it, so every text must be at least MIN_TEXT_PX pixels high
# after that scaling (tests/test_learn_figures.py measures each figure).
DPI = 110
PAGE_PX = 980
MIN_TEXT_PX = 9.0
SMALL, LABEL, TITLE = 8, 9, 10  # points: tick labels, numbers in cells, legends / axis
#                                 labels, captions / titles
FIGURES: dict[str, Callable[[], Figure]] = {}


def figure(name: str) -> Callable[[Callable[[], Figure]], Callable[[], Figure]]:
    def register(fn: Callable[[], Figure]) -> Callable[[], Figure]:
        FIGURES[name] = fn
        return fn

    return register


def text_on_page(fig: Figure) -> tuple[int, float, str]:
    """``(width in pixels, height in pixels of the smallest text as a page shows it, that
    text)`` for ``fig`` saved at DPI and shown at most PAGE_PX wide. Draws the figure first,
    so tick labels and the constrained layout exist."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig).draw()
    width = round(fig.get_figwidth() * DPI)
    shown = min(1.0, PAGE_PX / width)
    texts = [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()
             and t.get_figure(root=True) is fig]
    smallest = min(texts, key=lambda t: t.get_fontsize())
    return width, smallest.get_fontsize() * DPI / 72 * shown, smallest.get_text()


def caption(fig: Figure, text: str) -> None:
    """A note under the panels, inside the image, for what could be misread."""
    fig.text(0.5, 0.01, text, ha="center", va="bottom", fontsize=LABEL, style="italic",
             color="#444444", wrap=True)


def heat(ax, w, keep=None, title="", q_labels=None, k_labels=None, annotate=False,
         vmax=None, xlabel="keys", ylabel="queries"):
    """A weight matrix: Reds for allowed cells, grey hatched for excluded ones (False in
    ``keep``), NaN drawn black with its value written. ``annotate``: True writes every
    cell's value, "allowed" only those of the cells that are not excluded."""
    w = np.asarray(w, dtype=float)
    excluded = np.zeros(w.shape, bool) if keep is None else ~np.broadcast_to(keep, w.shape)
    shown = np.ma.masked_array(np.where(np.isnan(w), 0, w), mask=excluded)
    top = vmax if vmax is not None else max(float(np.nanmax(np.where(excluded, 0, w))), 1e-9)
    image = ax.imshow(shown, cmap="Reds", vmin=0, vmax=top, aspect="equal")
    image.cmap.set_bad(GREY)
    for i, j in zip(*np.nonzero(excluded)):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="none", edgecolor=HATCH,
                               hatch="///", linewidth=0))
    for i, j in zip(*np.nonzero(np.isnan(w))):
        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="black"))
    if annotate:
        for i in range(w.shape[0]):
            for j in range(w.shape[1]):
                val = w[i, j]
                if annotate == "allowed" and excluded[i, j]:
                    continue
                dark = np.isnan(val) or (not excluded[i, j] and val > 0.6 * top)
                ax.text(j, i, "nan" if np.isnan(val) else f"{val:.2f}".lstrip("0") or "0",
                        ha="center", va="center", fontsize=SMALL,
                        color="white" if dark else "black")
    ax.set_title(title, fontsize=TITLE)
    ax.set_xlabel(xlabel, fontsize=LABEL)
    ax.set_ylabel(ylabel, fontsize=LABEL)
    Tq, Tk = w.shape
    ax.set_xticks(range(Tk), k_labels if k_labels is not None else range(Tk), fontsize=SMALL,
                  rotation=90 if k_labels is not None and max(map(len, k_labels)) > 2 else 0)
    ax.set_yticks(range(Tq), q_labels if q_labels is not None else range(Tq), fontsize=SMALL)
    return image


# -- README ------------------------------------------------------------------------------


@figure("readme_padded_batch.png")
def readme_padded_batch() -> Figure:
    # The README's first example, exactly.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 4))  # (B, T, D): two sentences padded to 5 tokens
    valid_lens = np.array([3, 5])
    out, w = an.scaled_dot_product_attention(x, x, x, valid_lens=valid_lens)
    tokens = [["the", "cat", "sat", "<pad>", "<pad>"], ["a", "dog", "ran", "home", "fast"]]
    keep = an.sequence_mask(valid_lens, 5)[:, None, :]  # (B, 1, Tk)
    fig = Figure(figsize=(7.2, 3.9), layout="constrained")
    axes = fig.subplots(1, 2)
    for b in range(2):
        image = heat(axes[b], w[b], keep[b], f"sentence {b}: valid_len = {valid_lens[b]}",
                     tokens[b], tokens[b], annotate=True, vmax=1)
    fig.colorbar(image, ax=axes, shrink=0.8, label="attention weight")
    # The words are labels only: x is random, so the pattern inside the valid keys is chance.
    fig.suptitle("x = random vectors, untrained: the words are labels, not inputs",
                 fontsize=TITLE, weight="bold")
    fig.get_layout_engine().set(rect=(0, 0.09, 1, 0.91))
    caption(fig, "Each row sums to 1 over the valid keys; padding keys (hatched) get exactly 0.\n"
            "valid_lens masks keys only: the <pad> queries of sentence 0 still get rows.")
    return fig


# -- 0. start here -------------------------------------------------------------------------


@figure("00_pooling.png")
def pooling() -> Figure:
    # Chapter 0's first block: noisy readings of sin, averaged by similarity of position.
    rng = np.random.default_rng(0)
    x_known = np.sort(rng.uniform(0, 5, 40))
    y_known = np.sin(x_known) + 0.3 * rng.standard_normal(40)
    x_new = np.linspace(0.5, 4.5, 5)

    def average_by_similarity(xq, width):
        weights = an.softmax(-((xq[:, None] - x_known[None, :]) / width) ** 2 / 2)
        return weights @ y_known, weights

    fig = Figure(figsize=(9.5, 3.7), layout="constrained")
    ax, ax_w = fig.subplots(1, 2, width_ratios=[1.15, 1])
    grid = np.linspace(0, 5, 400)
    ax.plot(grid, np.sin(grid), color="0.5", ls="--", lw=1, label="sin x (hidden)")
    ax.scatter(x_known, y_known, s=14, color="0.35", label="readings",
               zorder=3)
    for width, color in ((0.1, "tab:orange"), (0.4, "tab:red"), (2.0, "tab:purple")):
        ax.plot(grid, average_by_similarity(grid, width)[0], color=color, lw=1.6,
                label=f"width {width}")
    guess, weights = average_by_similarity(x_new, 0.4)
    ax.scatter(x_new, guess, marker="D", s=40, color="tab:red", edgecolor="k", zorder=4,
               label="the 5 queries")
    ax.set_xlabel("x", fontsize=LABEL)
    ax.set_ylabel("y", fontsize=LABEL)
    ax.set_ylim(-2.5, 2.0)
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="lower left", ncols=3, columnspacing=1.0)
    ax.set_title("each guess (a curve: one per width): an average of\n"
                 "every reading, weighted by how near it was taken", fontsize=TITLE)

    image = ax_w.imshow(weights, cmap="Reds", vmin=0, aspect="auto",
                        extent=(-0.5, len(x_known) - 0.5, len(x_new) - 0.5, -0.5))
    ax_w.set_yticks(range(len(x_new)), [f"x = {x:g}" for x in x_new], fontsize=SMALL)
    ticks = np.arange(0, len(x_known), 8)
    ax_w.set_xticks(ticks, [f"{x_known[j]:.1f}" for j in ticks], fontsize=SMALL)
    ax_w.set_xlabel("keys: positions of the 40 readings, left to right", fontsize=LABEL)
    ax_w.set_ylabel("queries", fontsize=LABEL)
    ax_w.set_title("the weights (width 0.4): one row per query,\neach row sums to 1",
                   fontsize=TITLE)
    fig.colorbar(image, ax=ax_w, shrink=0.85)
    return fig


# -- 1. softmax ----------------------------------------------------------------------------


@figure("01_softmax.png")
def softmax_numerics() -> Figure:
    fig = Figure(figsize=(9, 3.8), layout="constrained")
    left, right = fig.subfigures(1, 2, width_ratios=[1.15, 1])
    ax = left.subplots()
    c = np.logspace(-1.3, 2.4, 800)
    base = np.array([1.0, 2.0, 3.0, 4.0])

    def naive(x, dtype):
        with np.errstate(all="ignore"):
            e = np.exp(x.astype(dtype))
            return (e / e.sum(-1, keepdims=True))[..., -1].astype(float)

    logits = c[:, None] * base
    stable = an.softmax(logits)[:, -1]
    ax.plot(c, stable, color="black", lw=1.5, label="max trick (any dtype)", zorder=1)
    # The naive softmax drawn as points, sampled along c: where it agrees they sit on the
    # black curve; past the overflow they leave it, for 0 (a number: drawn where it is) or
    # for NaN (no number: drawn in the NaN strip above the axis).
    NAN_Y = 1.19
    ax.axhspan(1.1, 1.28, facecolor="0.93", lw=0, zorder=0)
    samples = np.logspace(-1.3, 2.4, 44)
    for dtype, color, name, marker, shift in ((np.float64, "tab:blue", "float64", "o", 1.0),
                                              (np.float16, "tab:red", "float16", "x", 1.1)):
        # Where it first goes wrong, on the fine grid of the curve.
        fine = naive(logits, dtype)
        wrong = np.isnan(fine) | (np.abs(fine - stable) > 0.05)
        first, nan_from = c[wrong][0], c[np.isnan(fine)][0]
        at = np.sort(np.append(samples * shift, first))  # the first wrong c is drawn too
        y = naive(at[:, None] * base, dtype)
        exact = an.softmax(at[:, None] * base)[:, -1]
        nan = np.isnan(y)
        style = ({"facecolors": "none", "edgecolors": color} if marker == "o"
                 else {"color": color})
        ax.scatter(at[~nan], y[~nan], marker=marker, s=26, linewidths=1.3, zorder=3,
                   label=f"naive exp / sum, {name}", **style)
        ax.scatter(at[nan], np.full(nan.sum(), NAN_Y), marker=marker, s=26, linewidths=1.3,
                   zorder=3, **style)
        ax.axvline(first, color=color, lw=0.8, ls=":", zorder=0)
        note = (f"{name}: NaN from c = {nan_from:.0f}" if first == nan_from
                else f"{name}: 0 at c = {first:.2f},\nNaN from c = {nan_from:.1f}")
        x_text, ha, y_text = ((first / 1.12, "right", 0.62) if dtype == np.float64
                              else (first * 1.12, "left", 0.2))
        ax.text(x_text, y_text, f"{note}\n(exp(4c) > {np.finfo(dtype).max:.3g})",
                fontsize=SMALL, color=color, ha=ha, va="center")
        assert np.allclose(y[~nan & (at < first)], exact[~nan & (at < first)], atol=0.02)
    ax.set_xscale("log")
    ax.set_xlim(c[0], c[-1])
    ax.set_xlabel("c   (logits = c * [1, 2, 3, 4])", fontsize=LABEL)
    ax.set_ylabel("weight of the largest logit", fontsize=LABEL)
    ax.set_ylim(-0.06, 1.28)
    ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0, NAN_Y], ["0", ".2", ".4", ".6", ".8", "1", "NaN"])
    ax.axhline(0, color="0.7", lw=0.5)
    ax.tick_params(labelsize=SMALL)
    ax.legend(fontsize=SMALL, loc="center left", bbox_to_anchor=(0.0, 0.72))
    ax.set_title("overflow: the naive points leave the curve, for 0 or NaN", fontsize=TITLE)

    # Right: filling masked scores in float16 (row 0: two keys masked, row 1: all masked).
    scores = np.array([[2.0, 1.0, 0.5, 0.0], [1.0, 2.0, 3.0, 4.0]])
    keep = np.array([[True, True, False, False], [False, False, False, False]])
    def filled_softmax(fill: np.ndarray) -> np.ndarray:
        """The notes' recipe: write ``fill`` into masked scores, then the max trick."""
        with np.errstate(all="ignore"):
            x = np.where(keep, scores, fill).astype(np.float32)
            e = np.exp(x - x.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)

    with np.errstate(over="ignore"):
        fp16_fill = np.float16(-1e9)  # -inf: float16 stops at 65504
    axes = right.subplots(3, 1)
    rows = [(filled_softmax(fp16_fill),
             "fill -1e9 in float16: it becomes\n-inf, the empty row is NaN"),
            (filled_softmax(np.float16(-1e4)),
             "fill -1e4: the empty row is uniform\nover the keys it may not see"),
            (an.masked_softmax(scores, mask=keep),
             "attnkit.numpy.masked_softmax:\nthe empty row is 0")]
    for ax, (w, title) in zip(axes, rows):
        heat(ax, w, keep, "", annotate=True, vmax=1, xlabel="", ylabel="")
        ax.set_yticks([0, 1], ["2 masked", "all masked"], fontsize=SMALL)
        ax.set_title(title, fontsize=LABEL, loc="left")
    axes[-1].set_xlabel("keys (hatched = masked)", fontsize=LABEL)
    return fig


# -- 2. masks ------------------------------------------------------------------------------


@figure("02_masks.png")
def masks() -> Figure:
    panels = [
        (np.broadcast_to(an.sequence_mask(np.array([3]), 5), (3, 5)),
         "valid_lens=[3], (B,)\nsame keys, every query", "queries"),
        (an.sequence_mask(np.array([[0, 2, 4]]), 5)[0],
         "valid_lens=[[0,2,4]]\n(B, Tq): one per query", "queries"),
        (an.causal_mask(3, 5), "causal=True, Tq=3, Tk=5\nbottom-right (default)", "queries"),
        (an.causal_mask(3, 5, "top_left"), 'causal="top_left"\n(SDPA\'s is_causal)', "queries"),
        (an.window_mask(5, 5, 2, 0), "window=(2, 0)\n(causal, 2 keys back)", "queries"),
        (an.causal_mask(5, 5) & an.segment_mask(
            an.segment_ids_from_padding_mask(np.array([[0, 0, 1, 1, 1]])), (1, 5, 5))[0],
         "causal & left padding\n(segment_ids, pad = -1)", "queries"),
    ]
    fig = Figure(figsize=(8.9, 5.6), layout="constrained")
    axes = fig.subplots(2, 3)
    for ax, (keep, title, ylabel) in zip(axes.flat, panels):
        w = an.masked_softmax(np.zeros(keep.shape), mask=keep)
        # The shades of 1/3, 1/4 and 1/5 are hard to tell apart: the numbers are written.
        image = heat(ax, w, keep, title, annotate="allowed", vmax=1, ylabel=ylabel)
    fig.colorbar(image, ax=axes, shrink=0.6, label="weight (equal scores)")
    fig.get_layout_engine().set(rect=(0, 0.1, 1, 0.9))
    caption(fig, "Every score is 0 here, so an allowed key's weight is 1 / (allowed keys in "
            "its row).\nHatched = may not attend. A row with no allowed key (query 0 of the "
            "second panel,\nqueries 0-1 of the last: padding) gets weight 0 everywhere and "
            "output 0.")
    return fig


# -- 3. score functions ----------------------------------------------------------------------


@figure("03_score_functions.png")
def score_functions() -> Figure:
    rng = np.random.default_rng(3)
    D, h = 6, 8
    q = rng.standard_normal((1, 4, D))   # the SAME 4 queries ...
    k = rng.standard_normal((1, 8, D))   # ... and the SAME 8 keys for both score functions
    v = np.eye(8)[None]
    lens = np.array([6])
    w_q, w_k = rng.standard_normal((D, h)), rng.standard_normal((D, h))
    w_v = rng.standard_normal(h)
    _, w_add = an.additive_attention(q, k, v, w_q, w_k, w_v, valid_lens=lens)
    _, w_dot = an.scaled_dot_product_attention(q, k, v, valid_lens=lens)
    _, w_raw = an.scaled_dot_product_attention(q, k, v, valid_lens=lens, scale=1.0)
    keep = an.sequence_mask(lens, 8)[:, None, :]
    same_k = np.ones((1, 8, D))
    _, w_flat = an.additive_attention(q, same_k, v, w_q, w_k, w_v, valid_lens=lens)

    fig = Figure(figsize=(10, 6.2), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1, 1.05])
    axes = top.subplots(1, 4)
    panels = [(w_add[0], "additive w_v . tanh(qW_q + kW_k)\nrandom, untrained W's"),
              (w_dot[0], "scaled dot product\nq . k / sqrt(6)"),
              (w_raw[0], "dot product\nno 1 / sqrt(d)"),
              (w_flat[0], "d2l's demo: all 8 keys = ones\nuniform, any score function")]
    for ax, (w, title) in zip(axes, panels):
        image = heat(ax, w, keep[0], title, vmax=1)
    top.colorbar(image, ax=axes, shrink=0.8, label="weight")
    top.suptitle("4 queries, 8 keys (D = 6), valid_len = 6: the same keys under three score "
                 "functions (left), d2l's all-ones keys (right)",
                 fontsize=TITLE)

    # Why 1/sqrt(d): raw dot products of random unit-variance vectors grow like sqrt(d).
    ax1, ax2 = bottom.subplots(1, 2)
    dims = np.array([2, 4, 8, 16, 32, 64, 128, 256, 512])
    r = np.random.default_rng(0)
    std_raw, top_raw, top_scaled = [], [], []
    for d in dims:
        qq = r.standard_normal((256, d))
        kk = r.standard_normal((32, d))
        s = qq @ kk.T
        std_raw.append(s.std())
        top_raw.append(an.softmax(s).max(-1).mean())
        top_scaled.append(an.softmax(s / np.sqrt(d)).max(-1).mean())
    ax1.plot(dims, std_raw, "o-", label="std of q . k")
    ax1.plot(dims, np.sqrt(dims), "k:", label="sqrt(d)")
    ax1.plot(dims, np.array(std_raw) / np.sqrt(dims), "s-", label="std of q . k / sqrt(d)")
    ax1.set_xscale("log", base=2)
    ax1.set_yscale("log", base=2)
    ax1.set_xlabel("head dim d (q, k entries ~ N(0, 1))", fontsize=LABEL)
    ax1.set_ylabel("std over 256 x 32 scores", fontsize=LABEL)
    ax1.legend(fontsize=SMALL)
    ax1.set_title("raw scores spread like sqrt(d)", fontsize=TITLE)
    ax2.plot(dims, top_raw, "o-", label="softmax(q . k)")
    ax2.plot(dims, top_scaled, "s-", label="softmax(q . k / sqrt(d))")
    ax2.axhline(1 / 32, color="grey", ls=":", lw=0.8)
    ax2.text(2, 1 / 32 + 0.02, "uniform (1/32)", fontsize=SMALL, color="grey")
    ax2.set_xscale("log", base=2)
    ax2.set_ylim(0, 1.02)
    ax2.set_xlabel("head dim d", fontsize=LABEL)
    ax2.set_ylabel("mean largest weight (32 keys)", fontsize=LABEL)
    ax2.legend(fontsize=SMALL)
    ax2.set_title("unscaled, the softmax saturates to one key", fontsize=TITLE)
    fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))
    caption(fig, "Top: the additive panel uses random weights (no training): "
            "its pattern is chance. "
            "Sharper or flatter says nothing about which score function is better.")
    return fig


# -- 4. heads ------------------------------------------------------------------------------


def _split_heads_panels(top) -> None:
    """Three tokens of width 8 cut into 4 heads of 2, the right way and the wrong way: each
    cell says which token and which features of it a head sees at a position."""
    T, E, H, Dk = 3, 8, 4, 2
    colors = ["#9ecae1", "#fdae6b", "#a1d99b"]  # one per token
    memory_ax, right_ax, wrong_ax = top.subplots(1, 3, width_ratios=[1.25, 1, 1])

    def cell(ax, x, y, w, token, text, bad=False):
        ax.add_patch(Rectangle((x, y), w, 1, facecolor=colors[token], edgecolor="k", lw=0.6))
        if bad:
            ax.add_patch(Rectangle((x + 0.04, y + 0.04), w - 0.08, 0.92, facecolor="none",
                                   edgecolor="#c00000", lw=2.0))
        ax.text(x + w / 2, y + 0.5, text, ha="center", va="center", fontsize=SMALL)

    for t in range(T):  # memory: token after token, E numbers each
        for f in range(E):
            cell(memory_ax, f, T - 1 - t, 1, t, f"f{f}")
        memory_ax.text(-0.2, T - 0.5 - t, f"token {t}", ha="right", va="center",
                       fontsize=SMALL)
    for h in range(H):
        if h:
            memory_ax.plot([h * Dk, h * Dk], [-0.15, T + 0.15], color="k", lw=2.2)
        memory_ax.text(h * Dk + Dk / 2, -0.3, f"head {h}", ha="center", va="top",
                       fontsize=SMALL)
    memory_ax.set_title("q = q_proj(x): (T=3, E=8), stored token\nafter token; heads = "
                        "columns of Dk=2", fontsize=LABEL)
    memory_ax.set_xlim(-2.6, E + 0.1)

    flat = [(t, f) for t in range(T) for f in range(E)]  # the order memory holds them in
    for ax, title, right in ((right_ax, ".view(B, T, H, Dk).transpose(1, 2):\nhead h, "
                              "position t = token t", True),
                             (wrong_ax, ".view(B, H, T, Dk), no transpose:\nthe same "
                              "memory, cut in order", False)):
        for h in range(H):
            for t in range(T):
                start = (t * E + h * Dk) if right else (h * T + t) * Dk
                token, f = flat[start]
                cell(ax, t * 1.1, H - 1 - h, 1, token, f"t{token}\nf{f}-{f + Dk - 1}",
                     bad=token != t)
            ax.text(-0.15, H - 0.5 - h, f"head {h}", ha="right", va="center",
                    fontsize=SMALL)
        for t in range(T):
            ax.text(t * 1.1 + 0.5, H + 0.1, f"pos {t}", ha="center", va="bottom",
                    fontsize=SMALL)
        ax.set_title(title, fontsize=LABEL)
        ax.set_xlim(-1.3, T * 1.1)
    wrong_ax.text(T * 1.1 / 2 - 0.6, -0.25, "red: a head reads another token\nat this "
                  "position; tokens mix", ha="center", va="top", fontsize=SMALL,
                  color="#c00000")
    right_ax.text(T * 1.1 / 2 - 0.6, -0.25, "every head sees a piece\nof every token, "
                  "in place", ha="center", va="top", fontsize=SMALL)
    for ax in (memory_ax, right_ax, wrong_ax):
        ax.set_ylim(-1.2, max(T, H) + 0.6)
        ax.set_aspect("equal")
        ax.axis("off")
    top.suptitle("splitting q into heads: which numbers each head gets", fontsize=TITLE)


@figure("04_heads.png")
def heads() -> Figure:
    H, E, Dk = 8, 64, 8
    fig = Figure(figsize=(9.5, 6.6), layout="constrained")
    top, bottom = fig.subfigures(2, 1, height_ratios=[1.15, 1.35])
    _split_heads_panels(top)

    # Bottom: how many key/value heads the query heads share.
    axes = bottom.subplots(1, 3)
    for ax, (Hkv, name) in zip(axes, ((8, "multi-head (MHA)"), (2, "grouped-query (GQA)"),
                                      (1, "multi-query (MQA)"))):
        G = H // Hkv
        colors = [f"C{g}" for g in range(Hkv)]
        for h in range(H):
            ax.add_patch(FancyBboxPatch((h - 0.38, 1.7), 0.76, 0.5, boxstyle="round,pad=0.02",
                                        facecolor=colors[h // G], alpha=0.35, edgecolor="k"))
            ax.text(h, 1.95, f"q{h}", ha="center", va="center", fontsize=SMALL)
        # Every key/value head is Dk wide, as every query head: the boxes are the same size.
        centers = [(g + 0.5) * G - 0.5 for g in range(Hkv)]
        for g, x in enumerate(centers):
            ax.add_patch(FancyBboxPatch((x - 0.38, 0.1), 0.76, 0.5, boxstyle="round,pad=0.02",
                                        facecolor=colors[g], alpha=0.6, edgecolor="k"))
            ax.text(x, 0.35, f"k{g}\nv{g}", ha="center", va="center", fontsize=SMALL,
                    linespacing=0.9)
            for h in range(g * G, (g + 1) * G):
                ax.plot([h, x], [1.7, 0.6], color=colors[g], lw=0.8)
        kv_params = 2 * E * Hkv * Dk
        ax.text(3.5, -0.3, f"H = {H}, Hkv = {Hkv}, G = H // Hkv = {G}\n"
                f"K/V weights: 2 x {E} x {Hkv * Dk} = {kv_params}\n"
                f"KV cache per token, layer:\n2 x {Hkv} x {Dk} = {2 * Hkv * Dk} numbers",
                ha="center", va="top", fontsize=SMALL)
        ax.set_xlim(-0.6, H - 0.4)
        ax.set_ylim(-2.1, 2.3)
        ax.axis("off")
        ax.set_title(name, fontsize=TITLE)
    caption(fig, "Query head h reads key/value head h // G; every head is Dk = 8 wide. "
            "E = 64: the query side and the output are the same size in all three.")
    fig.get_layout_engine().set(rect=(0, 0.05, 1, 0.95))
    return fig


# -- 5. gradients --------------------------------------------------------------------------


@figure("05_gradients.png")
def gradients() -> Figure:
    x = np.array([2.0, 1.0, 0.1, -1.0, 0.5])
    y = an.softmax(x)
    J = np.diag(y) - np.outer(y, y)
    fig = Figure(figsize=(9.5, 3.6), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2, width_ratios=[1, 1.3])
    lim = np.abs(J).max()
    image = ax1.imshow(J, cmap="RdBu_r", norm=TwoSlopeNorm(0, -lim, lim))
    for i in range(5):
        for j in range(5):
            ax1.text(j, i, f"{J[i, j]:.2f}", ha="center", va="center", fontsize=SMALL,
                     color="white" if abs(J[i, j]) > 0.6 * lim else "black")
    ax1.set_xticks(range(5), [f"x{j}={x[j]:g}" for j in range(5)], fontsize=SMALL, rotation=45)
    ax1.set_yticks(range(5), [f"y{i}={y[i]:.2f}" for i in range(5)], fontsize=SMALL)
    ax1.set_title("softmax Jacobian dy_i/dx_j = y_i (1[i=j] - y_j)\nrows sum to 0", fontsize=TITLE)
    fig.colorbar(image, ax=ax1, shrink=0.8)

    # Finite differences of attention: error against the hand-written pullback vs the step.
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 3, 4)) for _ in range(3))
    g = rng.standard_normal((1, 3, 4))
    u = rng.standard_normal(q.shape)
    (out, _), pullback = an.vjp(an.scaled_dot_product_attention, q, k, v)
    exact = float(np.sum(pullback(g)[0] * u))

    def f(qq):
        return float(np.sum(an.scaled_dot_product_attention(qq, k, v)[0] * g))

    eps = np.logspace(-12, -0.5, 60)
    forward = [abs((f(q + e * u) - f(q)) / e - exact) / abs(exact) for e in eps]
    central = [abs((f(q + e * u) - f(q - e * u)) / (2 * e) - exact) / abs(exact) for e in eps]
    ax2.loglog(eps, forward, label="forward difference (f(x+e) - f(x)) / e")
    ax2.loglog(eps, central, label="central difference (f(x+e) - f(x-e)) / 2e")
    ax2.axhline(1e-6, color="grey", ls=":", lw=0.8)
    ax2.text(2e-9, 1.4e-6, "attnkit's test bar: 1e-6", fontsize=SMALL, color="grey")
    ax2.set_xlabel("step e (float64)", fontsize=LABEL)
    ax2.set_ylabel("relative error vs the hand-written dQ", fontsize=LABEL)
    ax2.legend(fontsize=SMALL, loc="lower left")
    ax2.set_title("checking dQ of attention: rounding (left) vs truncation (right)", fontsize=TITLE)
    return fig


# -- 6. flash attention ----------------------------------------------------------------------


@figure("06_flash.png")
def flash() -> Figure:
    T, bq, bk = 16, 4, 4
    keep = an.causal_mask(T, T)
    fig = Figure(figsize=(10, 4), layout="constrained")
    ax1, ax2 = fig.subplots(1, 2)
    # Cells as every figure draws them: allowed white, masked grey and hatched.
    ax1.imshow(np.ones(keep.shape), cmap="Greys", vmin=0, vmax=1e9, aspect="equal")
    for i, j in zip(*np.nonzero(~keep)):
        ax1.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor=GREY, edgecolor=HATCH,
                                hatch="///", linewidth=0))
    counts = {"full": 0, "diag": 0, "skip": 0}
    for i0 in range(0, T, bq):
        for j0 in range(0, T, bk):
            tile = keep[i0:i0 + bq, j0:j0 + bk]
            if tile.all():
                color, label = "tab:green", "full"
            elif tile.any():
                color, label = "tab:orange", "diag"
            else:
                color, label = "none", "skip"
            counts[label] += 1
            ax1.add_patch(Rectangle((j0 - 0.5, i0 - 0.5), bk, bq, facecolor=color, alpha=0.3,
                                    edgecolor="k", lw=1))
            ax1.text(j0 + bk / 2 - 0.5, i0 + bq / 2 - 0.5, label, ha="center", va="center",
                     fontsize=LABEL, bbox={"facecolor": "white", "lw": 0, "pad": 1})
    ax1.set_xticks(range(0, T, bk))
    ax1.set_yticks(range(0, T, bq))
    ax1.set_xlabel("keys (tiles of 4)", fontsize=LABEL)
    ax1.set_ylabel("queries (tiles of 4)", fontsize=LABEL)
    ax1.set_title(f"causal, T = 16: {counts['full']} green tiles need no mask, {counts['diag']} "
                  f"orange ones a mask,\n{counts['skip']} skipped ones are never computed "
                  "(hatched cells = masked)", fontsize=TITLE)

    # One query row, keys arriving in blocks: the running max and log-normaliser.
    rng = np.random.default_rng(6)
    s = rng.standard_normal(64) * 2.0
    s[37] = 9.0  # a large score arrives late, in the 5th block (keys 32-39)
    blocks = np.arange(8, 65, 8)
    m = np.array([s[:b].max() for b in blocks])
    l_rel = np.array([np.exp(s[:b] - s[:b].max()).sum() for b in blocks])
    ax2.step(range(1, 9), m, where="post", label="running max m", marker="o")
    ax2.step(range(1, 9), m + np.log(l_rel), where="post", label="running LSE m + log(l)",
             marker="s")
    ax2.axhline(an.logsumexp(s), color="k", ls=":", lw=1, label="logsumexp of the whole row")
    ax2.annotate("block 5 holds a score of 9.0: m jumps,\nand the sums kept so far are "
                 "multiplied\nby exp(m_old - m_new) before adding the block",
                 (5, 7.0), xytext=(1.0, 7.4), fontsize=SMALL, arrowprops={"arrowstyle": "->"})
    ax2.set_xlabel("key blocks seen (8 keys each)", fontsize=LABEL)
    ax2.set_ylabel("natural-log units", fontsize=LABEL)
    ax2.legend(fontsize=SMALL, loc="center right")
    ax2.set_title("online softmax of one row of 64 scores", fontsize=TITLE)
    return fig


# -- 7. KV cache -----------------------------------------------------------------------------


@figure("07_kv_cache.png")
def kv_cache() -> Figure:
    import torch

    from attnkit.torch import MultiHeadAttention

    torch.manual_seed(0)
    P, steps, E = 5, 3, 16
    mha = MultiHeadAttention(E, 4, num_kv_heads=2).eval()
    x = torch.randn(2, P + steps, E)
    real = torch.tensor([[0, 0, 1, 1, 1] + [1] * steps, [1] * (P + steps)]).bool()
    cache = mha.init_cache(batch_size=2, capacity=P + steps)
    rows = torch.zeros(2, P + steps, P + steps)
    with torch.no_grad():
        _, w = mha(x[:, :P], causal=True, mask=real[:, None, None, :P], cache=cache,
                   need_weights=True)  # (B, Tq, Tk), averaged over heads
        rows[:, :P, :P] = w
        for t in range(P, P + steps):
            _, w = mha(x[:, t:t + 1], causal=True, mask=real[:, None, None, :t + 1],
                       cache=cache, need_weights=True)
            rows[:, t, :t + 1] = w[:, 0]
    keep = (np.tril(np.ones((P + steps, P + steps), bool))[None]
            & real.numpy()[:, None, :] & real.numpy()[:, :, None])
    labels = [["pad", "pad", "p0", "p1", "p2", "g0", "g1", "g2"],
              ["p0", "p1", "p2", "p3", "p4", "g0", "g1", "g2"]]
    fig = Figure(figsize=(8, 4.3), layout="constrained")
    axes = fig.subplots(1, 2)
    for b in range(2):
        image = heat(axes[b], rows[b].numpy(), keep[b],
                     f"batch row {b}: prompt of {int(real[b, :P].sum())} tokens"
                     + (", left-padded to 5" if b == 0 else ", no padding"),
                     labels[b], labels[b], xlabel="cache slots (keys)",
                     ylabel="queries: prefill, then 3 steps")
        axes[b].axhline(P - 0.5, color="tab:blue", lw=1.5)
        axes[b].text(P + steps - 0.6, P - 0.4, "decoding steps", fontsize=SMALL, color="tab:blue",
                     ha="right", va="top", bbox={"facecolor": "white", "lw": 0, "pad": 1})
    fig.colorbar(image, ax=axes, shrink=0.8, label="weight, mean over 4 heads")
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))
    caption(fig, "Random, untrained projections: the pattern of weights is chance; the hatched "
            "structure is what matters.\nBatch row 0: the two pad queries have no key (output 0). "
            "Each row g0-g2 is one decoding step, reading the cache.")
    return fig


# -- 8. a trained model ------------------------------------------------------------------------


@figure("08_trained.png")
def trained() -> Figure:
    from attnkit.numpy.train import train_reverse

    result = train_reverse(steps=150, eval_size=200, log=None)  # as the block of chapter 8
    digits = [str(d) for d in result.tokens]
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    ax0, ax1, ax2 = fig.subplots(1, 3, width_ratios=[1.2, 1, 1])
    ax0.plot(result.loss)
    ax0.set_yscale("log")
    ax0.set_xlabel("step", fontsize=LABEL)
    ax0.set_ylabel("cross-entropy", fontsize=LABEL)
    ax0.set_title(f"training (NumPy only): held-out accuracy {result.accuracy:.3f}", fontsize=TITLE)
    for h, ax in enumerate((ax1, ax2)):
        image = heat(ax, result.attention[h], None, f"trained head {h}",
                     [str(t) for t in range(len(digits))], digits, vmax=1,
                     xlabel="keys: the input digits", ylabel="query position t")
    fig.colorbar(image, ax=[ax1, ax2], shrink=0.8, label="weight")
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))
    caption(fig, "One held-out sequence. To write output t the layer must fetch input T-1-t: "
            "after training, both heads look there: the anti-diagonal.")
    return fig


# -- 9. a GPT trained on the course -------------------------------------------------------------


@figure("09_gpt.png")
def gpt_trained() -> Figure:
    import torch

    import attnkit.gpt as gpt

    # The chapter's run (ATTNKIT_LEARN_QUICK=1: its tiny run, as in the tests), and the two
    # habits the chapter measures, on the same 20 windows of the text.
    run = gpt.course_model("en", quick=os.environ.get("ATTNKIT_LEARN_QUICK") == "1")
    model, tok, text = run.model, run.tokenizer, run.text
    T = model.config.context
    starts = torch.randint(0, len(text) - T, (20,), generator=torch.Generator().manual_seed(0))
    windows = [text[s:s + T] for s in starts.tolist()]
    w = torch.stack([model.attention_weights(tok.encode(x)) for x in windows])[..., 16:, :]
    back = torch.arange(16, T)[:, None] - torch.arange(T)[None, :]
    space = torch.tensor([[c in " \n" for c in x] for x in windows])
    near = (w * ((back >= 0) & (back < 6))).sum(-1).mean((0, -1))            # (L, H)
    on_space = (w * space[:, None, None, None, :]).sum(-1).mean((0, -1))     # (L, H)
    picks = [(divmod(int(near.argmax()), near.shape[1]), "on the last six", near),
             (divmod(int(on_space.argmax()), near.shape[1]), "on spaces", on_space)]
    line = next(s for s in text.splitlines() if len(s) > 60)[:24]
    weights = model.attention_weights(tok.encode(line)).numpy()             # (L, H, t, t)
    chars = [c if c != " " else "\u2423" for c in line]
    fig = Figure(figsize=(11, 4), layout="constrained")
    ax0, ax1, ax2 = fig.subplots(1, 3, width_ratios=[1.3, 1, 1])
    ax0.plot(run.losses, lw=0.5)
    n = min(100, len(run.losses))
    last = float(np.mean(run.losses[-n:]))
    ax0.axhline(last, color="k", ls=":", lw=1)
    ax0.set_ylim(0, None)
    ax0.set_xlabel("step", fontsize=LABEL)
    ax0.set_ylabel("cross-entropy (nats per character)", fontsize=LABEL)
    ax0.set_title(f"training: {len(run.losses)} steps, last {n} at {last:.2f}", fontsize=TITLE)
    keep = np.tril(np.ones((len(line), len(line)), bool))
    for ax, ((layer, head), habit, value) in zip((ax1, ax2), picks):
        image = heat(ax, weights[layer, head], keep,
                     f"layer {layer} head {head}: {value[layer, head]:.2f} {habit}",
                     chars, chars, vmax=1, xlabel="keys", ylabel="queries")
    fig.colorbar(image, ax=[ax1, ax2], shrink=0.8, label="weight")
    fig.get_layout_engine().set(rect=(0, 0.08, 1, 0.92))
    caption(fig, "The chapter's GPT, trained on the course's chapters 0-8, on the first 24 "
            "characters of the course. The numbers in the titles are averages over 20 windows "
            "of the text (the chapter's table). Hatched: the future, never attended.")
    return fig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(HERE / "img"), help="folder for the PNGs")
    parser.add_argument("--only", nargs="*", default=None, help="figure names (no .png)")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    names = list(FIGURES)
    if args.only:
        names = [n for n in names if n.removesuffix(".png") in args.only]
    for name in names:
        fig = FIGURES[name]()
        width, px, text = text_on_page(fig)
        if px < MIN_TEXT_PX:
            raise SystemExit(f"{name}: {text!r} would be {px:.1f} px high on a {PAGE_PX} px "
                             f"page (figure {width} px wide); at least {MIN_TEXT_PX} px")
        path = os.path.join(args.out, name)
        fig.savefig(path, dpi=DPI)
        print(f"wrote {path} ({width} px wide, smallest text {px:.1f} px on the page)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
