"""The walk-through behind ``attnkit demo``: NumPy + matplotlib only.

Each step of :func:`run_demo` shows one idea attention is built on with the reference
implementation (:mod:`attnkit.numpy`), prints what it shows, and writes one PNG:

1. naive vs stable softmax on large logits (the naive one is written out here, as the
   counter-example: ``exp`` overflows and the row becomes NaN);
2. masked softmax with d2l's valid lengths;
3. additive vs scaled dot-product attention on the same queries and keys: d2l's example
   (identical keys, so any score function spreads evenly over the valid keys), then
   distinct keys, where they differ (the additive weights are random, untrained);
4. multi-head self-attention (3 x 11 x 35 input, 5 heads of 7) with its shape trace, at
   initialisation: random weights, so the heads show no pattern yet;
5. causal, padding and sliding-window masks, alone and combined.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np
from matplotlib.figure import Figure

from .. import numpy as an
from ..numpy.train import train_reverse
from .explorer import explore
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
    # exp overflows float64 past log(max float) = 709.78, i.e. once 4c does.
    overflow_c = float(np.log(np.finfo(np.float64).max)) / base.max()
    say(f"  logits c*[1, 2, 3, 4]: the naive softmax is NaN for c > {overflow_c:.1f} "
        f"(exp(4c) overflows float64 past 709.8); the stable one never is")

    fig = Figure(figsize=(8.4, 3.0), layout="constrained")
    ax0, ax1 = fig.subplots(1, 2)
    ax0.bar(["1000", "1001", "1002"], good, color="#c0392b")
    for i, p in enumerate(good):
        ax0.text(i, p + 0.02, f"{p:.3f}", ha="center", fontsize=8)
    ax0.set_ylim(0, 1)
    ax0.set_xlabel("logit")
    ax0.set_ylabel("probability")
    ax0.set_title("stable softmax of [1000, 1001, 1002]\n(naive: nan, nan, nan)", fontsize=9)
    # Where the naive softmax works it equals the stable one, so its curve would hide under
    # the stable line: draw it as sparse markers on top, and its NaN results as crosses on a
    # row of their own above the probability axis.
    nan_row = 1.13
    every = slice(None, None, 8)
    finite = ~np.isnan(naive_top)
    ax1.semilogx(scales, stable_top, color="#c0392b", lw=2.0, label="stable (max subtracted)",
                 zorder=2)
    ax1.plot(scales[finite][every], naive_top[finite][every], ls="none", marker="o", ms=5,
             mfc="none", mec="#2c3e50", mew=1.2, zorder=3,
             label="naive exp / sum: equal while finite")
    ax1.plot(scales[~finite][every], np.full((~finite).sum(), nan_row)[every], ls="none",
             marker="x", ms=6, mew=1.5, color="#2c3e50", zorder=3, label="naive: NaN")
    ax1.axvspan(overflow_c, scales[-1], color="#2c3e50", alpha=0.10, lw=0)
    ax1.axvline(overflow_c, color="#2c3e50", lw=0.8, ls=":")
    ax1.text(overflow_c * 0.92, 0.62, f"exp(4c) overflows\nfor c > {overflow_c:.0f}",
             fontsize=8, color="#2c3e50", ha="right")
    ax1.set_xlabel("scale c of logits c*[1, 2, 3, 4]")
    ax1.set_ylabel("p(largest logit)")
    ax1.set_ylim(0.2, 1.2)
    ax1.set_yticks([0.2, 0.4, 0.6, 0.8, 1.0, nan_row], ["0.2", "0.4", "0.6", "0.8", "1.0", "NaN"])
    ax1.legend(fontsize=7.5, loc="lower right", framealpha=0.95)
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
    fig = plot_attention(
        weights, mask=keep, titles=["batch 0: valid_len = 2", "batch 1: valid_len = 3"],
        panel_size=2.4,
    )
    fig.suptitle("random scores (uniform in [0, 1)): each row sums to 1 over its valid keys",
                 fontsize=9)
    return fig


def _additive_vs_dot(rng: np.random.Generator, say: Say) -> Figure:
    # Every panel gets the same queries, keys, values and valid lengths; only the score
    # function differs. Top, d2l's example: every key is the same vector, so every valid
    # key gets the same score whatever the score function, the weights are even over the
    # valid keys, and both outputs are the mean of the valid values ([2, 3, 4, 5] and
    # [10, 11, 12, 13]): the panels are identical by construction, that is the lesson.
    # Bottom, distinct keys: now the two score functions give different weights. The
    # additive one has random, untrained W_q, W_k, w_v, so its weights are one arbitrary
    # score function among many: different from the dot product, not sharper or better.
    keys = {"identical keys": np.ones((2, 10, 2)), "distinct keys": rng.normal(size=(2, 10, 2))}
    values = np.tile(np.arange(40.0).reshape(1, 10, 4), (2, 1, 1))
    valid_lens = np.array([2, 6])
    queries = rng.normal(size=(2, 1, 2))  # one query per batch element, as wide as the keys
    w_q, w_k, w_v = rng.normal(size=(2, 8)), rng.normal(size=(2, 8)), rng.normal(size=8)
    rows = []
    for name, k in keys.items():
        out_add, w_add = an.additive_attention(
            queries, k, values, w_q, w_k, w_v, valid_lens=valid_lens
        )
        out_dot, w_dot = an.scaled_dot_product_attention(queries, k, values,
                                                         valid_lens=valid_lens)
        say(f"  {name}: additive (random W_q, W_k, w_v) output: "
            f"{np.round(out_add[:, 0], 3).tolist()}")
        say(f"  {name}: scaled dot-product output:            "
            f"{np.round(out_dot[:, 0], 3).tolist()}")
        rows.append([w_add[:, 0, :], w_dot[:, 0, :]])  # each (B, Tk): one query per batch
    say("  same queries and keys in both: identical keys give every valid key the same score, "
        "so any score function spreads evenly; distinct keys separate them, differently for "
        "each score function (the additive weights are random, untrained)")
    weights = np.array(rows)  # (2 key sets, 2 methods, B, Tk): drawn as rows x columns
    keep = an.sequence_mask(valid_lens, 10)  # (B, Tk)
    fig = plot_attention(
        weights, mask=keep,
        titles=[f"{method}, {name}" for name in keys
                for method in ("additive (random weights)", "scaled dot-product")],
        q_tokens=["batch 0 (valid_len 2)", "batch 1 (valid_len 6)"], ylabel="",
        k_tokens=[str(j) for j in range(10)], panel_size=3.6,
    )
    fig.suptitle(
        "the same queries and values in all four panels; the rows differ in the keys, the "
        "columns in the score function\n"
        "top, d2l's example (identical keys): every valid key scores the same, so both give "
        "the same even weights\n"
        "bottom, distinct keys: the weights differ; additive's W_q, W_k, w_v are random "
        "(untrained),\nso its panel shows a different function, not a sharper one",
        fontsize=9)
    return fig


def _multi_head(say: Say) -> Figure:
    # Batch 3, length 11, 5 heads of width 7 (E = 35), with freshly initialised projections:
    # what the heads attend to here is chance, which the title says, so that nobody reads
    # a learned pattern into it (`attnkit train` draws attention that was learned).
    _, weights = trace_shapes(embed_dim=35, num_heads=5, batch=3, seq=11, say=say)
    say("  the projections are random (untrained), so each head's weights are arbitrary; "
        "every row sums to 1")
    fig = show_heatmaps(
        weights[:1], xlabel="keys", ylabel="queries",
        titles=[f"head {h}" for h in range(5)], figsize=(11.0, 3.0),
        cbar_label="attention weight",
    )
    fig.suptitle("untrained multi-head self-attention (random projection weights, batch "
                 "element 0): any pattern here is chance, not learned", fontsize=10)
    return fig


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
    fig = plot_attention(
        weights, mask=keep, q_tokens=tokens, k_tokens=tokens,
        titles=["causal", "padding (valid_len 6)", "causal & padding",
                "window (2, 0) & padding"],
    )
    fig.suptitle("random scores: read where the grey cells fall, not the colours; each row "
                 "sums to 1 over the keys it may attend", fontsize=10)
    return fig


def run_demo(out_dir: PathLike = "attnkit-out", *, seed: int = 0, say: Say = print) -> list[str]:
    """Walk through the ideas attention is built on with the NumPy reference; write one PNG
    per step.

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
        ("3. additive vs scaled dot-product attention: d2l's identical keys, then distinct keys",
         "03_additive_vs_dot_product.png", lambda: _additive_vs_dot(rng, say)),
        ("4. multi-head attention at initialisation, 3 x 11 x 35 input, 5 heads of 7",
         "04_multi_head_weights.png", lambda: _multi_head(say)),
        ("5. causal, padding and window masks", "05_masks.png", lambda: _masks(rng, say)),
    ]
    written = []
    for title, name, make in steps:
        say(title)
        path = save_figure(make(), os.path.join(os.fspath(out_dir), name))
        say(f"  wrote {path}")
        written.append(path)
    say("6. a trained model's attention, in the explorer (open the page in a browser)")
    path = _explore_trained(os.path.join(os.fspath(out_dir), "06_explore_reverse.html"), seed)
    say(f"  wrote {path}")
    written.append(path)
    return written


def _explore_trained(path: str, seed: int) -> str:
    """Train the NumPy reversal model (about a second) and write the explorer page of its
    learned self-attention: each output position reads the input digit it must emit."""
    result = train_reverse(log=None, steps=150, batch_size=32, eval_size=200, seed=seed)
    digits = [str(d) for d in result.tokens.tolist()]
    title = (f"reverse {len(digits)} digits, NumPy model after 150 steps "
             f"(held-out accuracy {result.accuracy:.2f})")
    # Queries are output positions (the digits they emit, the input reversed); keys are the
    # input digits: every line should join a digit to itself.
    page = explore(result.attention, digits[::-1], k_tokens=digits, title=title)
    return os.fspath(page.save(path))
