"""A model that learns with nothing but NumPy: reverse a sequence of digits.

The model is an embedding (token + learned position), one multi-head self-attention layer
and a linear output head. Reversal is a pure alignment task: the output at position ``i``
is the input token at ``T - 1 - i``, so the attention must learn to look there (the
saved attention maps show an anti-diagonal). Every gradient comes from the hand-written
backward (:func:`attnkit.numpy.vjp`), the update from :class:`attnkit.numpy.optim.Adam`.

Held-out sequences are drawn first, and training batches never contain one of them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .mha import MultiHeadParams, multi_head_attention
from .optim import Adam
from .softmax import log_softmax
from .vjp import vjp

__all__ = ["ReverseConfig", "ReverseResult", "train_reverse"]


@dataclass
class ReverseConfig:
    seq_len: int = 8  # T: digits per sequence
    vocab: int = 10  # digits 0..9
    embed_dim: int = 32  # E
    num_heads: int = 2  # H (head dim E // H)
    steps: int = 600  # optimizer steps
    batch_size: int = 64  # sequences per step
    lr: float = 1e-2  # Adam learning rate (cosine-decayed to 0.1x)
    eval_size: int = 1000  # held-out sequences
    seed: int = 0
    log_every: int = 100  # progress lines (0 = silent)


@dataclass
class ReverseResult:
    loss: np.ndarray  # (steps,) training cross-entropy per step
    accuracy: float  # held-out token accuracy
    attention: np.ndarray  # (H, T, T) learned attention on held-out example 0
    tokens: np.ndarray  # (T,) that example's input digits
    seconds: float  # wall time of the training loop and evaluation
    params: dict[str, Any] = field(repr=False)  # the trained parameters

    def save(self, path: str) -> None:
        """``.npz`` with ``loss``, ``accuracy``, ``attention``, ``tokens`` (for plotting)."""
        np.savez(
            path, loss=self.loss, accuracy=np.float64(self.accuracy),
            attention=self.attention, tokens=self.tokens,
        )


def _init(cfg: ReverseConfig, rng: np.random.Generator) -> dict[str, Any]:
    E, V, T = cfg.embed_dim, cfg.vocab, cfg.seq_len
    return {
        "embed": rng.normal(0.0, 1.0, (V, E)),  # token embedding
        "pos": rng.normal(0.0, 1.0, (T, E)),  # learned position embedding
        "attn": MultiHeadParams.init(E, cfg.num_heads, rng=rng),
        "head_w": rng.normal(0.0, 1.0 / np.sqrt(E), (E, V)),  # output head
        "head_b": np.zeros(V),
    }


def _loss_and_grads(
    params: dict[str, Any], tokens: np.ndarray, targets: np.ndarray
) -> tuple[float, dict[str, Any]]:
    """Mean cross-entropy of the model on ``tokens (B, T)`` and its gradients."""
    B, T = tokens.shape
    x = params["embed"][tokens] + params["pos"]  # (B, T, E)
    (y, _), pullback = vjp(multi_head_attention, params["attn"], x)  # (B, T, E)
    logits = y @ params["head_w"] + params["head_b"]  # (B, T, V)
    logp = log_softmax(logits)
    n = B * T
    loss = -np.take_along_axis(logp, targets[..., None], axis=-1).sum() / n
    # d loss / d logits = (softmax - onehot) / n
    d_logits = np.exp(logp)
    np.put_along_axis(
        d_logits, targets[..., None], np.take_along_axis(d_logits, targets[..., None], -1) - 1, -1
    )
    d_logits /= n
    d_y = d_logits @ params["head_w"].T
    d_attn, d_x = pullback(d_y)
    d_embed = np.zeros_like(params["embed"])
    np.add.at(d_embed, tokens, d_x)  # each token row gets the sum over its occurrences
    grads = {
        "embed": d_embed,
        "pos": d_x.sum(axis=0),
        "attn": d_attn,
        "head_w": y.reshape(n, -1).T @ d_logits.reshape(n, -1),
        "head_b": d_logits.sum(axis=(0, 1)),
    }
    return float(loss), grads


def _predict(params: dict[str, Any], tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = params["embed"][tokens] + params["pos"]
    y, weights = multi_head_attention(params["attn"], x)
    return np.argmax(y @ params["head_w"] + params["head_b"], axis=-1), weights


def train_reverse(
    config: ReverseConfig | None = None,
    *,
    log: Callable[[str], None] | None = print,
    **overrides: Any,
) -> ReverseResult:
    """Train the reversal model and evaluate it on held-out sequences.

    Args:
        config: hyper-parameters (defaults: :class:`ReverseConfig`).
        log: receives sparse progress lines; None = silent.
        **overrides: replace single fields of ``config``, e.g. ``steps=200``.

    Returns:
        A :class:`ReverseResult` (loss curve, held-out accuracy, attention maps).
    """
    cfg = ReverseConfig(**{**(config or ReverseConfig()).__dict__, **overrides})
    rng = np.random.default_rng(cfg.seed)
    T, V = cfg.seq_len, cfg.vocab
    codes = V ** np.arange(T)  # a sequence's number, to exclude held-out ones from training
    held_out = rng.integers(0, V, (cfg.eval_size, T))
    held_codes = held_out @ codes

    params = _init(cfg, rng)
    opt = Adam(params, lr=cfg.lr)
    losses = np.empty(cfg.steps)
    start = time.perf_counter()
    for step in range(cfg.steps):
        tokens = rng.integers(0, V, (cfg.batch_size, T))
        tokens = tokens[~np.isin(tokens @ codes, held_codes)]
        loss, grads = _loss_and_grads(params, tokens, tokens[:, ::-1])
        opt.lr = cfg.lr * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / cfg.steps)))
        opt.step(grads)
        losses[step] = loss
        if log and cfg.log_every and (step % cfg.log_every == 0 or step == cfg.steps - 1):
            log(f"step {step:5d}  loss {loss:.4f}")
    pred, weights = _predict(params, held_out)
    accuracy = float(np.mean(pred == held_out[:, ::-1]))
    seconds = time.perf_counter() - start
    if log:
        log(f"held-out token accuracy {accuracy:.4f} ({cfg.eval_size} sequences), {seconds:.1f} s")
    return ReverseResult(losses, accuracy, weights[0], held_out[0], seconds, params)
