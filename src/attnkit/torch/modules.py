"""Attention layers as ``nn.Module`` s: thin wrappers over :mod:`attnkit.torch.functional`.

- :class:`DotProductAttention` and :class:`AdditiveAttention` are drop-in replacements for
  d2l's classes of the same names (the constructors of d2l 0.17 and of d2l 1.0,
  ``forward(queries, keys, values, valid_lens)``, ``.attention_weights``, same parameter
  names), minus their bugs: no large-negative fill, no write into the scores, fully masked
  rows give 0, not a uniform average.
- :class:`MultiHeadAttention` (in :mod:`attnkit.torch.mha`, re-exported here) does what
  ``torch.nn.MultiheadAttention`` does, plus GQA/MQA, free head dims, bottom-right causal
  and sliding windows, d2l ``valid_lens``, and a KV cache for decoding.
"""

from __future__ import annotations

import inspect
from typing import Any, overload

import torch
from torch import nn

from ..spec import check_softcap
from .additive import additive_attention
from .functional import attention
from .mha import MultiHeadAttention

__all__ = ["AdditiveAttention", "DotProductAttention", "MultiHeadAttention"]


class DotProductAttention(nn.Module):
    """Scaled dot-product attention with dropout on the weights (d2l's class, fixed).

    d2l 0.17 and d2l 1.0 construct it alike, ``DotProductAttention(dropout)``; it has no
    parameters, so their (empty) state dicts load.

    Args:
        dropout: probability of zeroing an attention weight in training.
        softcap: logit soft-capping ``softcap * tanh(s / softcap)``; None = off.
        sinks: learn one attention-sink logit, the parameter ``sinks (1,)`` (zeros).

    After each forward, ``attention_weights`` holds the pre-dropout weights ``(B, Tq, Tk)``,
    differentiable as in d2l (the output itself comes from the fused kernel; see
    ``need_weights`` in :func:`attnkit.torch.attention` for what the weights cost).
    """

    attention_weights: torch.Tensor | None

    def __init__(
        self, dropout: float = 0.0, *, softcap: float | None = None, sinks: bool = False
    ) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.softcap = check_softcap(softcap)
        self.sinks = nn.Parameter(torch.zeros(1)) if sinks else None
        self.attention_weights = None

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
        *,
        causal: bool | str = False,
        segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """Args:
            queries: ``(B, Tq, D)``.
            keys: ``(B, Tk, D)``.
            values: ``(B, Tk, Dv)``.
            valid_lens: ``(B,)`` or ``(B, Tq)``; keys ``j < valid_len`` are valid.
            causal: True/``"bottom_right"`` or ``"top_left"``
                (:func:`attnkit.torch.attention`).
            segment_ids: ``(B, T)`` (self-attention) or ``(q_ids (B, Tq), kv_ids (B, Tk))``.

        Returns:
            ``(B, Tq, Dv)``.
        """
        shapes = (tuple(queries.shape), tuple(keys.shape), tuple(values.shape))
        if any(len(s) != 3 for s in shapes) or not shapes[0][0] == shapes[1][0] == shapes[2][0] \
                or shapes[0][2] != shapes[1][2] or shapes[1][1] != shapes[2][1]:
            # attention() reads axis -3 as heads: batch 4 against 2 would become GQA; and
            # its own messages would name the (B, 1, T, D) views, not these shapes.
            raise ValueError(
                f"expected queries (B, Tq, D), keys (B, Tk, D), values (B, Tk, Dv) with one "
                f"B, one D and one Tk, got queries {shapes[0]}, keys {shapes[1]}, values "
                f"{shapes[2]}"
            )
        # One head axis, so that the sink is one logit (attention() reads axis -3 as heads).
        out, weights = attention(
            queries[:, None], keys[:, None], values[:, None], valid_lens=valid_lens,
            causal=causal, softcap=self.softcap,
            sinks=None if self.sinks is None else self.sinks.to(queries.dtype),
            segment_ids=segment_ids, dropout_p=self.dropout.p, training=self.training,
            need_weights=True,
        )
        self.attention_weights = None if weights is None else weights[:, 0]
        return out[:, 0]


def _d2l_017(key_size: int, query_size: int, num_hiddens: int, dropout: float = 0.0) -> None:
    """d2l 0.17's ``AdditiveAttention``: eager ``nn.Linear`` s of known input widths."""


def _d2l_103(num_hiddens: int, dropout: float = 0.0) -> None:
    """d2l 1.0's ``AdditiveAttention``: ``nn.LazyLinear`` s, input widths read on first use."""


_ADDITIVE_SIGNATURES = (inspect.signature(_d2l_017), inspect.signature(_d2l_103))


def _bind_additive(args: tuple, kwargs: dict) -> dict:
    """The arguments of whichever d2l signature ``args``/``kwargs`` fit (0.17 first: it
    needs three sizes, so ``(num_hiddens, dropout)`` can only be 1.0's)."""
    for sig in _ADDITIVE_SIGNATURES:
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        sizes = [v for k, v in bound.arguments.items() if k != "dropout"]
        if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in sizes):
            raise ValueError(f"AdditiveAttention{sig}: sizes must be positive ints, got {sizes}")
        return dict(bound.arguments)
    raise TypeError(
        "AdditiveAttention takes d2l 0.17's (key_size, query_size, num_hiddens, dropout=0.0) "
        f"or d2l 1.0's (num_hiddens, dropout=0.0); got args {args} and kwargs {kwargs}"
    )


class AdditiveAttention(nn.Module):
    """Bahdanau attention ``a(q, k) = w_v . tanh(W_q q + W_k k)`` (d2l's class, fixed).

    Both of d2l's constructors are accepted:

    - ``AdditiveAttention(key_size, query_size, num_hiddens, dropout=0.0)`` (d2l 0.17):
      ``W_k``, ``W_q``, ``w_v`` are ``nn.Linear`` s built now;
    - ``AdditiveAttention(num_hiddens, dropout=0.0)`` (d2l 1.0): they are
      ``nn.LazyLinear`` s whose input widths are read on the first forward (or from a
      loaded state dict), materialised in d2l's order (``W_q``, ``W_k``, ``w_v``), so the
      same seed gives d2l's weights.

    The ``(B, Tq, Tk, num_hiddens)`` feature tensor is never built for long inputs: scores
    are computed in key chunks holding at most ``max_chunk_elements`` features (default
    4 Mi, 16 MiB in float32), and the backward recomputes each chunk instead of storing it.
    Peak extra memory: one such chunk plus a few ``(B, Tq, Tk)`` tensors (scores, weights,
    their gradients); results equal the one-shot computation to float rounding.

    Args:
        key_size: width of the keys (d2l 0.17 form).
        query_size: width of the queries (d2l 0.17 form).
        num_hiddens: ``h``, the width of the tanh features.
        dropout: probability of zeroing an attention weight in training.
        max_chunk_elements: the feature budget per key chunk (keyword only).
        device, dtype: of the parameters (keyword only).

    Parameters keep d2l's names (``W_k``, ``W_q``, ``w_v``), so its state dicts load.
    """

    attention_weights: torch.Tensor | None

    @overload
    def __init__(
        self, key_size: int, query_size: int, num_hiddens: int, dropout: float = 0.0, *,
        max_chunk_elements: int = ..., device: torch.device | str | None = ...,
        dtype: torch.dtype | None = ...,
    ) -> None: ...

    @overload
    def __init__(
        self, num_hiddens: int, dropout: float = 0.0, *, max_chunk_elements: int = ...,
        device: torch.device | str | None = ..., dtype: torch.dtype | None = ...,
    ) -> None: ...

    def __init__(
        self,
        *args: Any,
        max_chunk_elements: int = 1 << 22,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        a = _bind_additive(args, kwargs)
        kw = {"device": device, "dtype": dtype}
        h = a["num_hiddens"]
        if "key_size" in a:
            self.W_k = nn.Linear(a["key_size"], h, bias=False, **kw)
            self.W_q = nn.Linear(a["query_size"], h, bias=False, **kw)
            self.w_v = nn.Linear(h, 1, bias=False, **kw)
        else:
            self.W_k = nn.LazyLinear(h, bias=False, **kw)
            self.W_q = nn.LazyLinear(h, bias=False, **kw)
            self.w_v = nn.LazyLinear(1, bias=False, **kw)
        self.dropout = nn.Dropout(a["dropout"])
        self.max_chunk_elements = int(max_chunk_elements)
        self.attention_weights = None

    def _materialise(self, queries: torch.Tensor, keys: torch.Tensor) -> None:
        """Turn lazy ``W_q``, ``W_k``, ``w_v`` into ``nn.Linear`` s, in the order d2l 1.0's
        forward calls them (so that they draw d2l's initial values from torch's RNG): each
        is called once on an empty batch, which runs its own initialisation hook (a no-op
        for weights a state dict already filled)."""
        lazy = nn.modules.lazy.LazyModuleMixin
        if isinstance(self.W_q, lazy):
            self.W_q(queries[:0])
        if isinstance(self.W_k, lazy):
            self.W_k(keys[:0])
        if isinstance(self.w_v, lazy):
            self.w_v(queries.new_empty(0, self.W_q.out_features))

    def forward(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        valid_lens: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Args:
            queries: ``(B, Tq, query_size)``.
            keys: ``(B, Tk, key_size)``.
            values: ``(B, Tk, Dv)``.
            valid_lens: ``(B,)`` or ``(B, Tq)``.

        Returns:
            ``(B, Tq, Dv)``.
        """
        self._materialise(queries, keys)
        out, weights = additive_attention(
            queries, keys, values, self.W_q.weight.T, self.W_k.weight.T, self.w_v.weight[0],
            valid_lens=valid_lens, dropout_p=self.dropout.p, training=self.training,
            max_chunk_elements=self.max_chunk_elements,
        )
        self.attention_weights = weights
        return out
