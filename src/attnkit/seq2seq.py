"""A small encoder-decoder that learns to align: the model behind ``attnkit train``.

Synthetic tasks on digit sequences of a fixed length ``T``:

- ``reverse``: ``3 1 4 1 5 -> 5 1 4 1 3``  (the learned attention is the anti-diagonal)
- ``copy``:    ``3 1 4 1 5 -> 3 1 4 1 5``  (the diagonal)
- ``sort``:    ``3 1 4 1 5 -> 1 1 3 4 5``  (each output looks up where its digit sits)

The model (Luong-style: the decoder attends after its recurrent step)::

    encoder   digit + position embeddings -> tanh(Linear) -> memory (B, T, Hd)
    decoder   previous digits (B, T) -> embedding -> GRU -> queries (B, T, Hd)
    attention queries attend to the memory -> context (B, T, Hd)
    output    tanh(Linear([query; context])) -> Linear -> logits (B, T, 10)

with the attention either :class:`attnkit.torch.AdditiveAttention` (Bahdanau scores) or
:class:`attnkit.torch.MultiHeadAttention` (scaled dot-product, several heads). Each encoder
state knows only its own digit and position (no recurrence across the input), so the only
way for the decoder to learn a digit is to attend to where it sits: the attention has to
align, and the heatmap shows it. Training uses teacher forcing (the decoder reads the true
previous digit); evaluation decodes greedily, one step at a time, feeding back its own
predictions, on held-out sequences.

Everything is seeded: the same :class:`TrainConfig` gives the same losses, accuracy and
figure on the same machine and thread count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from .train_config import MODELS, NUM_DIGITS, TASKS, TrainConfig

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "MODELS",
    "TASKS",
    "Seq2Seq",
    "TrainConfig",
    "TrainResult",
    "evaluate",
    "make_batch",
    "plot_cross_attention",
    "targets_for",
    "train",
]

BOS = NUM_DIGITS  # start-of-sequence token read by the decoder's first step
VOCAB = NUM_DIGITS + 1


def targets_for(task: str, src: np.ndarray) -> np.ndarray:
    """The target digits of ``task`` for source digits ``src (B, T)``."""
    if task == "reverse":
        return src[:, ::-1].copy()
    if task == "copy":
        return src.copy()
    if task == "sort":
        return np.sort(src, axis=1)
    raise ValueError(f"task must be one of {TASKS}, got {task!r}")


def make_batch(
    task: str, rng: np.random.Generator, batch_size: int, length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(src (B, T), tgt (B, T))`` int64 tensors of uniformly random digits."""
    src = rng.integers(0, NUM_DIGITS, size=(batch_size, length))
    return torch.from_numpy(src), torch.from_numpy(targets_for(task, src))


class Seq2Seq(nn.Module):
    """Encoder-decoder whose GRU decoder attends to the encoder states (module docstring).

    Args:
        attention: ``"additive"`` or ``"mha"``.
        hidden: ``Hd``, the width of embeddings, states and attention.
        num_heads: heads of the ``mha`` attention (``Hd % num_heads == 0``).
        max_len: the longest input (sizes the position embedding).
    """

    def __init__(
        self, attention: str = "additive", hidden: int = 64, num_heads: int = 4,
        max_len: int = 10,
    ):
        super().__init__()
        from attnkit.torch import AdditiveAttention, MultiHeadAttention

        self.attention_kind = attention
        self.src_embed = nn.Embedding(VOCAB, hidden)
        self.src_pos = nn.Embedding(max_len, hidden)
        self.encoder = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh())
        self.tgt_embed = nn.Embedding(VOCAB, hidden)
        self.decoder = nn.GRU(hidden, hidden, batch_first=True)
        self.attention: nn.Module
        if attention == "additive":
            self.attention = AdditiveAttention(hidden, hidden, hidden, 0.0)
        elif attention == "mha":
            self.attention = MultiHeadAttention(hidden, num_heads)
        else:
            raise ValueError(f"attention must be one of {MODELS}, got {attention!r}")
        self.combine = nn.Linear(2 * hidden, hidden)
        self.out = nn.Linear(hidden, NUM_DIGITS)  # BOS is never a target

    def encode(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``src (B, T)`` -> ``(memory (B, T, Hd), h0 (1, B, Hd))``.

        Each encoder state sees only its own digit and position, so the decoder can
        learn a digit only by attending to where it sits.
        """
        pos = torch.arange(src.shape[1], device=src.device)
        memory = self.encoder(self.src_embed(src) + self.src_pos(pos))
        h0 = memory.new_zeros(1, src.shape[0], memory.shape[-1])
        return memory, h0

    def attend(
        self, queries: torch.Tensor, memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``queries (B, Tq, Hd)`` over ``memory (B, T, Hd)``.

        Returns:
            ``(context (B, Tq, Hd), weights)``: weights ``(B, Tq, T)`` for additive,
            ``(B, H, Tq, T)`` for mha.
        """
        if self.attention_kind == "additive":
            context = self.attention(queries, memory, memory, None)
            return context, self.attention.attention_weights
        context, weights = self.attention(
            queries, memory, memory, need_weights=True, average_weights=False
        )
        return context, weights

    def decode(
        self, prev: torch.Tensor, memory: torch.Tensor, h: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``prev (B, Tq)`` tokens -> ``(logits (B, Tq, 10), weights, h (1, B, Hd))``."""
        queries, h = self.decoder(self.tgt_embed(prev), h)  # (B, Tq, Hd)
        context, weights = self.attend(queries, memory)
        hidden = torch.tanh(self.combine(torch.cat([queries, context], dim=-1)))
        return self.out(hidden), weights, h

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        """Teacher forcing: ``src, tgt (B, T)`` -> logits ``(B, T, 10)``."""
        memory, h0 = self.encode(src)
        bos = torch.full_like(tgt[:, :1], BOS)
        logits, _, _ = self.decode(torch.cat([bos, tgt[:, :-1]], dim=1), memory, h0)
        return logits

    @torch.no_grad()
    def greedy(self, src: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Greedy decoding of ``src (B, T)``, one step at a time.

        Returns:
            ``(predictions (B, T), weights)`` with weights ``(B, T, T)`` (additive) or
            ``(B, H, T, T)`` (mha): row ``t`` is where step ``t`` looked.
        """
        memory, h = self.encode(src)
        prev = torch.full_like(src[:, :1], BOS)
        preds, rows = [], []
        for _ in range(src.shape[1]):
            logits, weights, h = self.decode(prev, memory, h)
            prev = logits.argmax(-1)  # (B, 1)
            preds.append(prev)
            rows.append(weights)
        return torch.cat(preds, dim=1), torch.cat(rows, dim=-2)


@dataclass
class TrainResult:
    """What :func:`train` hands back."""

    model: Seq2Seq
    config: TrainConfig
    losses: list[float]  # training loss of every step
    seconds: float  # wall time of the training loop
    accuracy: float  # held-out exact-match accuracy (whole sequence right)
    token_accuracy: float  # held-out per-digit accuracy
    eval_src: torch.Tensor  # (N, T) held-out inputs
    eval_pred: torch.Tensor  # (N, T) greedy predictions
    eval_weights: torch.Tensor  # (N, T, T) or (N, H, T, T) cross-attention of greedy decoding


def evaluate(
    model: Seq2Seq, task: str, src: torch.Tensor
) -> tuple[float, float, torch.Tensor, torch.Tensor]:
    """Greedy-decode ``src (N, T)``.

    Returns:
        ``(exact-match accuracy, per-digit accuracy, predictions (N, T), weights)``.
    """
    was_training = model.training
    model.eval()
    try:
        pred, weights = model.greedy(src)
    finally:
        model.train(was_training)
    tgt = torch.from_numpy(targets_for(task, src.numpy()))
    right = pred == tgt
    return right.all(dim=1).double().mean().item(), right.double().mean().item(), pred, weights


def _held_out(config: TrainConfig) -> torch.Tensor:
    """``eval_size`` sequences from their own generator; :func:`train` drops them from its
    training batches, so the score is on sequences the model never saw."""
    rng = np.random.default_rng([config.seed, 1])
    return torch.from_numpy(rng.integers(0, NUM_DIGITS, size=(config.eval_size, config.length)))


def train(
    config: TrainConfig, *, progress: Callable[[int, float], None] | None = None
) -> TrainResult:
    """Train :class:`Seq2Seq` on ``config.task`` and evaluate it on held-out sequences.

    Args:
        config: the run (seeded; see :class:`TrainConfig`).
        progress: called as ``progress(step, loss)`` after every step (1-based).

    Returns:
        A :class:`TrainResult`.
    """
    # One intra-op thread by default: every op here is tiny (B=64, T=10, Hd=64), so a
    # second thread mostly adds synchronisation, and on a shared 2-core machine its
    # spin-waits made a run 10-20x slower in our measurements.
    saved_threads = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        torch.manual_seed(config.seed)
        model = Seq2Seq(config.model, config.hidden, config.num_heads, config.length)
        opt = torch.optim.Adam(model.parameters(), lr=config.lr)
        # Cosine decay to 10% of lr: the last steps polish instead of bouncing.
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(s / config.steps, 1)))
        )
        eval_src = _held_out(config)
        seen = {tuple(r) for r in eval_src.tolist()}
        rng = np.random.default_rng([config.seed, 0])
        loss_fn = nn.CrossEntropyLoss()
        losses = []
        t0 = time.perf_counter()
        for step in range(1, config.steps + 1):
            src = tgt = torch.empty(0)
            while src.shape[0] == 0:  # keep held-out sequences out of training
                src, tgt = make_batch(config.task, rng, config.batch_size, config.length)
                fresh = torch.tensor([tuple(r) not in seen for r in src.tolist()])
                src, tgt = src[fresh], tgt[fresh]
            logits = model(src, tgt)
            loss = loss_fn(logits.reshape(-1, NUM_DIGITS), tgt.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            if progress is not None:
                progress(step, losses[-1])
        seconds = time.perf_counter() - t0
        acc, tok_acc, pred, weights = evaluate(model, config.task, eval_src)
    finally:
        torch.set_num_threads(saved_threads)
    return TrainResult(model, config, losses, seconds, acc, tok_acc, eval_src, pred, weights)


def plot_cross_attention(
    result: TrainResult, *, example: int = 0, path: str | None = None
) -> Figure:
    """The learned cross-attention of greedy decoding, as a Figure.

    Panels: one held-out example and, for the positional tasks, the mean over the whole
    held-out set; for ``mha``, the per-head means as well. The shared axes are labelled by
    position; the example panel also shows its digits (in on top, predicted on the right).
    For reversal the mass sits on the anti-diagonal, for copy on the diagonal; for sort
    each output step looks at the positions holding its digit.

    Args:
        result: from :func:`train`.
        example: which held-out sequence labels the first panel.
        path: when given, the figure is also written there.

    Returns:
        A :class:`matplotlib.figure.Figure`.
    """
    from attnkit.viz import plot_attention

    w = result.eval_weights.double()
    n = w.shape[0]
    if w.ndim == 4:  # (N, H, T, T): heads averaged first, then each head on its own
        panels = [w[example].mean(0), w.mean((0, 1))] + list(w.mean(0))
        H = w.shape[1]  # the first two panels average the heads: their titles say so
        titles = [f"held-out example {example} (mean of {H} heads)",
                  f"mean of {n} (by position) and of {H} heads"] + [
            f"head {h}, mean of {n}" for h in range(H)
        ]
    elif result.config.task == "sort":  # content-based: a mean by position is uniform
        panels, titles = [w[example]], [f"held-out example {example}"]
    else:
        panels = [w[example], w.mean(0)]
        titles = [f"held-out example {example}", f"mean of {n} (by position)"]
    cfg = result.config
    src, pred = result.eval_src[example].tolist(), result.eval_pred[example].tolist()
    # The panels share their axes, so the shared ticks are positions: a mean over many
    # sequences has no digits to show. The example panel adds its own digits on its top and
    # right edges.
    fig = plot_attention(
        torch.stack(panels), titles=titles, ncols=min(len(panels), 3),
        xlabel="input position", ylabel="output position",
        k_tokens=[str(i) for i in range(len(src))],
        q_tokens=[str(i) for i in range(len(pred))],
        panel_size=2.8,
    )
    ax = fig.axes[0]  # the example panel (the panels come first, then the colour bar)
    top = ax.secondary_xaxis("top")
    top.set_xticks(range(len(src)), [str(d) for d in src], fontsize=8)
    top.set_xlabel("input digit", fontsize=9)
    right = ax.secondary_yaxis("right")
    right.set_yticks(range(len(pred)), [str(d) for d in pred], fontsize=8)
    right.set_ylabel("predicted digit", fontsize=9)
    fig.suptitle(
        f"{cfg.task}, {cfg.model} attention\nexact-match {result.accuracy:.3f} "
        f"after {cfg.steps} steps", fontsize=10,
    )
    if path is not None:
        from attnkit.viz import save_figure

        save_figure(fig, path)
    return fig

