"""A small GPT (decoder-only Transformer) to train on the CPU: the model of the course's
chapter 9, "Build a GPT".

::

    tokens (B, T) -> token embedding + sinusoidal positions       (B, T, E)
                  -> num_layers x Block: x + attn(ln1(x)), x + mlp(ln2(x))   (pre-norm)
                  -> LayerNorm -> Linear                           logits (B, T, vocab)

Each block's attention is :class:`attnkit.torch.MultiHeadAttention` with ``causal=True``,
so decoding can keep a KV cache per layer (chapter 7). Text is read one character at a
time (:class:`CharTokenizer`). :func:`train` runs AdamW with a tqdm progress bar;
:func:`generate` samples greedily or with a temperature, with or without the cache, and
gives the same tokens either way.

Everything is seeded: the same config, text and thread count give the same losses.
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

try:
    import torch
except ModuleNotFoundError as _err:
    from ._optional import raise_missing

    raise_missing(_err, "torch", extra="torch", user="attnkit.gpt")
from torch import nn

from attnkit.torch import KVCache, MultiHeadAttention

__all__ = ["GPT", "Block", "CharTokenizer", "CourseRun", "GPTConfig", "course_model", "course_text",
           "generate", "sinusoids", "train"]


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of a :class:`GPT`."""

    vocab_size: int        # distinct characters of the text
    context: int = 128     # the longest sequence the model reads (training and sampling)
    embed_dim: int = 128   # E, the width of every token vector
    num_heads: int = 4     # H; each head is E // H wide
    num_layers: int = 4    # blocks in the stack
    dropout: float = 0.0   # on the residual branches, in training only


class CharTokenizer:
    """Characters <-> integer ids, over the characters of one text.

    Args:
        text: the text whose distinct characters make the vocabulary (sorted).
    """

    def __init__(self, text: str) -> None:
        self.chars = sorted(set(text))
        self.ids = {c: i for i, c in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> ids, ``(len(text),)`` int64; raises KeyError on an unknown char."""
        return torch.tensor([self.ids[c] for c in text], dtype=torch.long)

    def decode(self, ids: torch.Tensor | list[int]) -> str:
        """ids ``(T,)`` -> text."""
        return "".join(self.chars[i] for i in torch.as_tensor(ids).tolist())


def sinusoids(T: int, E: int) -> torch.Tensor:
    """The Transformer's positional encoding, ``(T, E)``: ``sin`` in the even columns and
    ``cos`` in the odd ones at frequencies ``1 / 10000**(2i / E)`` (chapter 0)."""
    pos = torch.arange(T, dtype=torch.float64)[:, None]                    # (T, 1)
    freq = 10000.0 ** (torch.arange(0, E, 2, dtype=torch.float64) / E)    # (ceil(E / 2),)
    P = torch.zeros(T, E, dtype=torch.float64)
    P[:, 0::2] = torch.sin(pos / freq)
    P[:, 1::2] = torch.cos(pos / freq[: E // 2])
    return P.float()


class Block(nn.Module):
    """One pre-norm block (as GPT-2 and Llama): ``x + attn(ln1(x))``, then
    ``x + mlp(ln2(x))``; ``(B, T, E) -> (B, T, E)``, causal.

    Args:
        embed_dim: ``E``.
        num_heads: ``H``, dividing ``E``.
        dropout: on both residual branches, in training only.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim)
        self.attn = MultiHeadAttention(embed_dim, num_heads)
        self.ln2 = nn.LayerNorm(embed_dim)
        self.mlp = nn.Sequential(nn.Linear(embed_dim, 4 * embed_dim), nn.GELU(),
                                 nn.Linear(4 * embed_dim, embed_dim))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, cache: KVCache | None = None,
                need_weights: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """``x (B, T, E)`` -> ``(B, T, E)`` (and the weights ``(B, H, T, Tk)`` when
        ``need_weights``). With ``cache``, ``x`` are the next positions after it."""
        a, w = self.attn(self.ln1(x), causal=True, cache=cache, need_weights=need_weights,
                         average_weights=False)
        x = x + self.drop(a)                               # tokens read earlier tokens
        x = x + self.drop(self.mlp(self.ln2(x)))           # each token on its own
        return (x, w) if need_weights else x


class GPT(nn.Module):
    """A decoder-only Transformer over characters.

    Args:
        config: the sizes.
        block: makes each block as ``block(embed_dim, num_heads)``: a module mapping
            ``(B, T, E)`` to ``(B, T, E)``, causal (yours from the chapter's exercise, say).
            Default: :class:`Block`, whose attention can keep a KV cache.
    """

    def __init__(self, config: GPTConfig,
                 block: Callable[[int, int], nn.Module] | None = None) -> None:
        super().__init__()
        self.config = config
        E = config.embed_dim
        self.cacheable = block is None
        make = block or (lambda e, h: Block(e, h, config.dropout))
        self.embed = nn.Embedding(config.vocab_size, E)
        self.register_buffer("positions", sinusoids(config.context, E), persistent=False)
        self.blocks = nn.ModuleList(make(E, config.num_heads) for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(E)
        self.head = nn.Linear(E, config.vocab_size)

    def forward(self, ids: torch.Tensor, caches: list[KVCache] | None = None) -> torch.Tensor:
        """``ids (B, T)`` -> logits ``(B, T, vocab_size)``, position ``t`` predicting
        token ``t + 1``. With ``caches`` (:meth:`init_caches`), ``ids`` continue the
        sequence the caches hold."""
        start = caches[0].length if caches else 0
        T = ids.shape[1]
        if start + T > self.config.context:
            raise ValueError(f"{start + T} positions exceed the context {self.config.context}")
        x = self.embed(ids) + self.positions[start:start + T]            # (B, T, E)
        for i, block in enumerate(self.blocks):
            x = block(x) if caches is None else block(x, cache=caches[i])
        return self.head(self.ln_f(x))                                    # (B, T, vocab)

    def init_caches(self, batch_size: int) -> list[KVCache]:
        """One empty KV cache per block, each holding up to ``context`` positions."""
        if not self.cacheable:
            raise TypeError("these blocks were made by your own factory: no KV cache")
        return [b.attn.init_cache(batch_size, self.config.context) for b in self.blocks]

    @torch.no_grad()
    def attention_weights(self, ids: torch.Tensor) -> torch.Tensor:
        """Every head's weights on one sequence: ``ids (T,)`` -> ``(L, H, T, T)``."""
        if ids.shape[0] > self.config.context:
            raise ValueError(f"{ids.shape[0]} positions exceed the context "
                             f"{self.config.context}")
        x = self.embed(ids[None]) + self.positions[: ids.shape[0]]
        weights = []
        for block in self.blocks:
            x, w = block(x, need_weights=True)
            weights.append(w[0])
        return torch.stack(weights)


def batches(data: torch.Tensor, context: int, batch_size: int,
            generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of ``data (N,)``: inputs and the same shifted by one, ``(B, context)``."""
    start = torch.randint(0, len(data) - context - 1, (batch_size,), generator=generator)
    rows = start[:, None] + torch.arange(context + 1)
    window = data[rows]                                                   # (B, context + 1)
    return window[:, :-1], window[:, 1:]


def train(model: GPT, data: torch.Tensor, *, steps: int, batch_size: int = 32,
          lr: float = 3e-3, seed: int = 0, progress: bool = True,
          threads: int | None = 1) -> list[float]:
    """Train ``model`` to predict the next token of ``data`` (ids, ``(N,)``).

    AdamW with a short warm-up and a cosine decay to a tenth of ``lr``, gradients
    clipped to norm 1, windows of ``model.config.context`` drawn at random (seeded).

    Args:
        model: the model (trained in place, left in eval mode).
        data: the token ids of the text.
        steps: optimizer steps.
        batch_size: windows per step.
        lr: the peak learning rate.
        seed: for the windows (seed the model's initialisation yourself).
        progress: a tqdm bar with the loss (``tqdm.auto``: a widget in Jupyter where
            ipywidgets is installed, else text).
        threads: torch's intra-op threads while training (restored after); None leaves
            them. One by default: the products here are small, and on a shared 2-core
            machine a second thread's spin-waits made steps ten times slower.

    Returns:
        The loss of every step (cross-entropy in nats per character).
    """
    with warnings.catch_warnings():  # Jupyter without ipywidgets: a text bar, no warning
        warnings.simplefilter("ignore")
        from tqdm.auto import tqdm

    with _threads(threads):
        return _train(model, data, tqdm, steps, batch_size, lr, seed, progress)


@contextlib.contextmanager
def _threads(n: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``n`` (None: left alone), restored after."""
    saved = torch.get_num_threads()
    if n is not None:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _train(model: GPT, data: torch.Tensor, tqdm: type, steps: int, batch_size: int,
           lr: float, seed: int, progress: bool) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    warm = max(1, steps // 20)

    def rate(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.1 + 0.45 * (1 + math.cos(math.pi * (step - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, rate)
    loss_fn = nn.CrossEntropyLoss()
    losses: list[float] = []
    model.train()
    with tqdm(total=steps, desc="training", unit="step", disable=not progress,
              mininterval=2.0) as bar:
        for _ in range(steps):
            x, y = batches(data, model.config.context, batch_size, generator)
            logits = model(x)                                             # (B, T, vocab)
            loss = loss_fn(logits.flatten(0, 1), y.flatten())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", refresh=False)
            bar.update(1)
    model.eval()
    return losses


@torch.no_grad()
def generate(model: GPT, prompt: torch.Tensor, steps: int, *, temperature: float = 0.0,
             use_cache: bool = True, seed: int = 0, threads: int | None = 1) -> torch.Tensor:
    """Continue ``prompt`` (ids ``(T,)``) by ``steps`` tokens; returns ``(T + steps,)``.

    Args:
        model: a trained :class:`GPT` (in eval mode).
        prompt: the ids to continue; the model reads ``T + steps - 1`` positions (never
            the last token), which must fit in the context.
        steps: new tokens.
        temperature: 0 picks the most likely token (greedy); above 0 samples from
            ``softmax(logits / temperature)``.
        use_cache: keep each layer's keys and values (one new position per step) instead
            of running the whole sequence again at every step. The tokens are the same.
        seed: for sampling.
        threads: torch's intra-op threads meanwhile, as in :func:`train`.
    """
    with _threads(threads):
        return _generate(model, prompt, steps, temperature, use_cache, seed)


def _generate(model: GPT, prompt: torch.Tensor, steps: int, temperature: float,
              use_cache: bool, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = prompt[None]                                                    # (1, T)
    caches = model.init_caches(1) if use_cache else None
    step_input = ids
    for _ in range(steps):
        logits = model(step_input if use_cache else ids, caches)[0, -1]   # (vocab,)
        if temperature == 0:
            nxt = logits.argmax()[None]
        else:
            probs = torch.softmax(logits / temperature, dim=-1)
            nxt = torch.multinomial(probs, 1, generator=generator)
        ids = torch.cat([ids, nxt[None]], dim=1)
        step_input = nxt[None]                                            # (1, 1)
    return ids[0]


def timed(fn: Callable[[], object]) -> tuple[object, float]:
    """``(fn(), seconds)``."""
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def _language(lang: str | None) -> str:
    if lang is None:
        from attnkit.check import get_language

        return get_language()
    if lang not in ("en", "zh"):
        raise ValueError(f"lang must be 'en' or 'zh', not {lang!r}")
    return lang


def course_text(lang: str | None = None) -> str:
    """The course's chapters 0-8 (``docs/learn/0[0-8]-*.md``, or ``docs/learn/zh/`` for
    ``lang="zh"``), joined: text that every clone has, written in one voice.

    Args:
        lang: ``"en"`` or ``"zh"``; None: the language attnkit reports in
            (:func:`attnkit.check.set_language`, else ``ATTNKIT_LANG``, which the Chinese
            notebooks set), else English.

    Looked for in the clone attnkit is imported from, then in the working folder and the
    folders above it (a notebook opened from ``docs/learn``).
    """
    import attnkit

    lang = _language(lang)
    sub = {"en": ("docs", "learn"), "zh": ("docs", "learn", "zh")}[lang]
    here = Path.cwd()
    roots = [Path(attnkit.__file__).resolve().parents[2], here, *here.parents]
    for root in roots:
        for folder in (root.joinpath(*sub), root if root.parts[-len(sub):] == sub else None):
            chapters = sorted(folder.glob("0[0-8]-*.md")) if folder else []
            if len(chapters) == 9:
                return "\n".join(p.read_text(encoding="utf-8") for p in chapters)
    raise FileNotFoundError(f"the course's chapters ({'/'.join(sub)}/0[0-8]-*.md) are in "
                            f"attnkit's repository, not in the installed package: run this "
                            f"from a clone")


@dataclass
class CourseRun:
    """A model trained on the course by :func:`course_model`, and how it went."""

    model: GPT
    tokenizer: CharTokenizer
    text: str             # what it was trained on
    losses: list[float]   # one per step, nats per character
    seconds: float        # training time
    steps: int
    batch_size: int


def course_model(lang: str | None = None, quick: bool = False) -> CourseRun:
    """Chapter 9's GPT, trained on :func:`course_text` ``(lang)``: once per process (the
    chapter's later blocks get the same model back at once).

    Args:
        lang: ``"en"`` or ``"zh"``: which edition of the course it reads (None: as
            :func:`course_text`).
        quick: a tiny model and a few steps (seconds), for the tests; the chapter's run
            takes about three minutes on two CPU cores.
    """
    return _course_model(_language(lang), quick)


@functools.cache
def _course_model(lang: str, quick: bool) -> CourseRun:
    text = course_text(lang)
    tokenizer = CharTokenizer(text)
    data = tokenizer.encode(text)
    if quick:
        config = GPTConfig(len(tokenizer), context=32, embed_dim=32, num_heads=4, num_layers=1)
        steps, batch_size = 30, 8
    else:
        config = GPTConfig(len(tokenizer), context=128, embed_dim=96, num_heads=4, num_layers=3)
        steps, batch_size = 1500, 8
    torch.manual_seed(0)
    model = GPT(config)
    losses, seconds = timed(lambda: train(model, data, steps=steps, batch_size=batch_size))
    return CourseRun(model, tokenizer, text, losses, seconds, steps, batch_size)
