"""The walk-through behind ``attnkit demo`` and ``attnkit trace``: NumPy + matplotlib only.

Each step of :func:`run_demo` revisits one idea of the seed notes with the reference
implementation (:mod:`attnkit.numpy`), prints what it shows, and writes one PNG:

1. naive vs stable softmax on large logits (the naive one is written out here, as the
   counter-example: ``exp`` overflows and the row becomes NaN);
2. masked softmax with d2l's valid lengths;
3. additive vs scaled dot-product attention on d2l's example;
4. multi-head attention on seed 001's input (3 x 11 x 35, 5 heads of 7) with its shape trace;
5. causal, padding and sliding-window masks, alone and combined.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from matplotlib.figure import Figure

from .. import numpy as an
from .heatmap import PathLike, plot_attention, save_figure, show_heatmaps
from .trace import Say, trace_shapes

__all__ = ["run_demo"]

def _softmax_stability(say: Say) -> Figure:
    """Naive ``exp(x) / sum(exp(x))`` against the max-subtracting softmax."""

    def naive_softmax(x: np.ndarray) -> np.ndarray:
        # The counter-example: no max subtraction, so exp(1000) = inf and inf/inf = nan.
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)

    logits = np.array([1000.0, 1001.0, 1002.0])
    with np.errstate(over="ignore", invalid="ignore"):
        bad = naive_softmax(logits)
    good = an.softmax(logits)
    say(f"  logits {logits}: naive {bad}, stable {np.round(good, 4)}")

    scales = np.logspace(0, 3, 200)
    base = np.array([1.0, 2.0, 3.0, 4.0])
    with np.errstate(over="ignore", invalid="ignore"):
        naive_top = np.array([naive_softmax(s * base)[-1] for s in scales])
    stable_top = np.array([an.softmax(s * base)[-1] for s in scales])
    first_nan = scales[np.argmax(np.isnan(naive_top))]
    say(f"  logits c*[1, 2, 3, 4]: the naive softmax is NaN from c = {first_nan:.0f} "
        f"(exp overflows float64 past 709.8); the stable one never is")

    fig = Figure(figsize=(8.4, 3.0), layout="constrained")
    ax0, ax1 = fig.subplots(1, 2)
    ax0.bar(["1000", "1001", "1002"], good, color="#c0392b")
    for i, p in enumerate(good):
        ax0.text(i, p + 0.02, f"{p:.3f}", ha="center", fontsize=8)
    ax0.set_ylim(0, 1)
    ax0.set_xlabel("logit")
    ax0.set_ylabel("probability")
    ax0.set_title("stable softmax of [1000, 1001, 1002]\n(naive: nan, nan, nan)", fontsize=9)
    ax1.semilogx(scales, stable_top, color="#c0392b", lw=2.5, label="stable (max subtracted)")
    ax1.semilogx(scales, naive_top, color="#2c3e50", lw=1.2, ls="--", label="naive exp / sum")
    ax1.axvspan(first_nan, scales[-1], color="#2c3e50", alpha=0.12, lw=0)
    ax1.text(first_nan * 1.1, 0.5, "naive\n= NaN", fontsize=9, color="#2c3e50")
    ax1.set_xlabel("scale c of logits c*[1, 2, 3, 4]")
    ax1.set_ylabel("p(largest logit)")
    ax1.set_ylim(0.2, 1.05)
    ax1.legend(fontsize=8, loc="lower right")
    ax1.set_title("the naive softmax breaks, the stable one saturates", fontsize=9)
    return fig


def _masked_softmax(rng: np.random.Generator, say: Say) -> Figure:
    scores = rng.uniform(size=(2, 2, 4))
    valid_lens = np.array([2, 3])
    weights = an.masked_softmax(scores, valid_lens)
    say("  masked_softmax(uniform (2, 2, 4), valid_lens=[2, 3]), rows of batch 0 then 1:")
    for row in weights.reshape(-1, 4):
        say(f"    {np.round(row, 4)}")
    keep = an.sequence_mask(valid_lens, 4)[:, None, :]  # (B, 1, Tk): every query alike
    return plot_attention(
        weights, mask=keep, titles=["valid_len = 2", "valid_len = 3"], panel_size=2.4,
    )


def _additive_vs_dot(rng: np.random.Generator, say: Say) -> Figure:
    # d2l's example: identical keys, so every valid key gets the same weight and the output
    # is the mean of the valid values ([2, 3, 4, 5] and [10, 11, 12, 13]).
    keys = np.ones((2, 10, 2))
    values = np.tile(np.arange(40.0).reshape(1, 10, 4), (2, 1, 1))
    valid_lens = np.array([2, 6])
    q_add = rng.normal(size=(2, 1, 20))
    w_q, w_k, w_v = rng.normal(size=(20, 8)), rng.normal(size=(2, 8)), rng.normal(size=8)
    out_add, w_add = an.additive_attention(
        q_add, keys, values, w_q, w_k, w_v, valid_lens=valid_lens
    )
    q_dot = rng.normal(size=(2, 1, 2))
    out_dot, w_dot = an.scaled_dot_product_attention(q_dot, keys, values, valid_lens=valid_lens)
    say(f"  additive (query width 20, key width 2) output: {np.round(out_add[:, 0], 3).tolist()}")
    say(f"  dot-product (query width 2) output:           {np.round(out_dot[:, 0], 3).tolist()}")
    # Rows are the two batch elements (one query each), as d2l draws them.
    weights = np.stack([w_add[:, 0, :], w_dot[:, 0, :]])  # (2 methods, B, Tk)
    keep = an.sequence_mask(valid_lens, 10)  # (B, Tk)
    return plot_attention(
        weights, mask=keep, titles=["additive", "scaled dot-product"],
        q_tokens=["batch 0 (valid_len 2)", "batch 1 (valid_len 6)"], ylabel="",
        k_tokens=[str(j) for j in range(10)],
        ncols=1, panel_size=4.2,
    )


def _multi_head(say: Say) -> Figure:
    # Seed 001's input: batch 3, length 11, 5 heads of width 7 (E = 35).
    _, weights = trace_shapes(embed_dim=35, num_heads=5, batch=3, seq=11, say=say)
    return show_heatmaps(
        weights[:1], xlabel="keys", ylabel="queries",
        titles=[f"head {h}" for h in range(5)], figsize=(11.0, 2.7),
    )


def _masks(rng: np.random.Generator, say: Say) -> Figure:
    tokens = ["the", "cat", "sat", "on", "the", "mat", "<pad>", "<pad>"]
    T = len(tokens)
    padding = np.broadcast_to(an.sequence_mask(np.array([6]), T), (T, T))
    causal = an.causal_mask(T, T)
    window = an.window_mask(T, T, 2, 0)
    keep = np.stack([causal, padding, causal & padding, window & padding])
    weights = an.masked_softmax(rng.normal(size=(4, T, T)), mask=keep)
    say("  causal: query i sees keys j <= i; padding: keys past valid_len 6 are excluded; "
        "window (2, 0): the 2 previous keys and itself")
    return plot_attention(
        weights, mask=keep, q_tokens=tokens, k_tokens=tokens,
        titles=["causal", "padding (valid_len 6)", "causal & padding",
                "window (2, 0) & padding"],
    )


def run_demo(out_dir: PathLike = "attnkit-out", *, seed: int = 0, say: Say = print) -> list[str]:
    """Walk through the seed notes with the NumPy reference; write one PNG per step.

    Args:
        out_dir: folder for the figures (created when missing).
        seed: seeds every random input.
        say: receives each printed line.

    Returns:
        The paths written, in order.
    """
    rng = np.random.default_rng(seed)
    steps: list[tuple[str, str, Callable[[], Figure]]] = [
        ("1. naive vs stable softmax on large logits", "01_softmax_stability.png",
         lambda: _softmax_stability(say)),
        ("2. masked softmax with valid lengths", "02_masked_softmax.png",
         lambda: _masked_softmax(rng, say)),
        ("3. additive vs scaled dot-product attention (d2l's example)",
         "03_additive_vs_dot_product.png", lambda: _additive_vs_dot(rng, say)),
        ("4. multi-head attention, seed 001's 3 x 11 x 35 input, 5 heads of 7",
         "04_multi_head_weights.png", lambda: _multi_head(say)),
        ("5. causal, padding and window masks", "05_masks.png", lambda: _masks(rng, say)),
    ]
    written = []
    for title, name, make in steps:
        say(title)
        path = save_figure(make(), os.path.join(os.fspath(out_dir), name))
        say(f"  wrote {path}")
        written.append(path)
    return written
