"""d2l's attention chapters as drop-ins: ``from attnkit.torch import d2l``.

Code written against d2l's classes (``from d2l import torch as d2l``) runs unchanged on
these, with their state dicts, minus d2l's bugs (no ``-1e6`` fill, no write into the
scores, a fully masked row gives 0, odd ``num_hiddens`` work in the positional encoding):

- :class:`DotProductAttention`, :class:`AdditiveAttention`, :func:`masked_softmax`: the
  same objects as in :mod:`attnkit.torch`;
- :class:`MultiHeadAttention`: d2l's multi-head attention (its constructor of d2l 1.0 or
  of 0.17, ``forward(queries, keys, values, valid_lens)``, weights at
  ``.attention.attention_weights``, parameters ``W_q``, ``W_k``, ``W_v``, ``W_o``). It is
  not :class:`attnkit.torch.MultiHeadAttention`, which takes
  ``(embed_dim, num_heads, *, ...)`` and does more (GQA, free head dims, caches);
- :class:`PositionalEncoding`: the sinusoidal encoding of d2l's self-attention chapter.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
from torch import nn

from .masks import masked_softmax
from .modules import AdditiveAttention, DotProductAttention

__all__ = [
    "AdditiveAttention", "DotProductAttention", "MultiHeadAttention", "PositionalEncoding",
    "masked_softmax",
]


def _d2l_017(key_size: int, query_size: int, value_size: int, num_hiddens: int,
             num_heads: int, dropout: float, bias: bool = False) -> None:
    """d2l 0.17's ``MultiHeadAttention``: ``nn.Linear`` s of known input widths."""


def _d2l_100(num_hiddens: int, num_heads: int, dropout: float, bias: bool = False) -> None:
    """d2l 1.0's ``MultiHeadAttention``: ``nn.LazyLinear`` s, widths read on first use."""


def _bind(args: tuple, kwargs: dict) -> dict:
    """The arguments of whichever d2l signature fits (0.17 first: it needs five sizes and
    a dropout, so four or fewer positional arguments can only be 1.0's)."""
    for sig in (inspect.signature(_d2l_017), inspect.signature(_d2l_100)):
        try:
            bound = sig.bind(*args, **kwargs)
        except TypeError:
            continue
        bound.apply_defaults()
        a = dict(bound.arguments)
        sizes = {k: v for k, v in a.items() if k not in ("dropout", "bias")}
        bad = {k: v for k, v in sizes.items()
               if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if bad:
            raise ValueError(f"MultiHeadAttention{sig}: sizes must be positive ints, got {bad}")
        if a["num_hiddens"] % a["num_heads"]:
            raise ValueError(
                f"num_hiddens={a['num_hiddens']} is not a multiple of num_heads="
                f"{a['num_heads']}: d2l's MultiHeadAttention splits num_hiddens among the "
                "heads. For head dims of your choosing use attnkit.torch.MultiHeadAttention("
                "embed_dim, num_heads, head_dim=...)"
            )
        return a
    raise TypeError(
        "d2l.MultiHeadAttention takes d2l 1.0's (num_hiddens, num_heads, dropout, "
        "bias=False) or d2l 0.17's (key_size, query_size, value_size, num_hiddens, "
        f"num_heads, dropout, bias=False); got args {args} and kwargs {kwargs}"
    )


class MultiHeadAttention(nn.Module):
    """d2l's multi-head attention: ``H`` heads of ``num_hiddens / H`` features each.

    Either of d2l's constructors:

    - ``MultiHeadAttention(num_hiddens, num_heads, dropout, bias=False)`` (d2l 1.0):
      ``W_q``, ``W_k``, ``W_v``, ``W_o`` are ``nn.LazyLinear`` s whose input widths are read
      on the first forward (or from a loaded state dict), in d2l's order, so the same seed
      gives d2l's initial weights;
    - ``MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads,
      dropout, bias=False)`` (d2l 0.17): ``nn.Linear`` s built now.

    ``forward(queries (B, Tq, q), keys (B, Tk, k), values (B, Tk, v), valid_lens)``
    returns ``(B, Tq, num_hiddens)``. As in d2l the heads are folded into the batch for the
    attention, so ``self.attention`` is a :class:`DotProductAttention` whose
    ``attention_weights`` are ``(B * H, Tq, Tk)``, example ``b``'s head ``h`` at row
    ``b * H + h`` (``.attention_weights.reshape(B, H, Tq, Tk)`` separates them).

    Keyword-only ``device`` and ``dtype`` place the parameters.
    """

    def __init__(self, *args: Any, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None, **kwargs: Any) -> None:
        super().__init__()
        a = _bind(args, kwargs)
        kw = {"bias": a["bias"], "device": device, "dtype": dtype}
        h = a["num_hiddens"]
        self.num_heads = a["num_heads"]
        self.attention = DotProductAttention(a["dropout"])
        if "key_size" in a:
            self.W_q = nn.Linear(a["query_size"], h, **kw)
            self.W_k = nn.Linear(a["key_size"], h, **kw)
            self.W_v = nn.Linear(a["value_size"], h, **kw)
            self.W_o = nn.Linear(h, h, **kw)
        else:
            self.W_q, self.W_k, self.W_v, self.W_o = (nn.LazyLinear(h, **kw) for _ in range(4))

    def transpose_qkv(self, X: torch.Tensor) -> torch.Tensor:
        """``(B, T, num_hiddens)`` -> ``(B * H, T, num_hiddens / H)``, heads into the batch."""
        B, T, _ = X.shape
        X = X.reshape(B, T, self.num_heads, -1).transpose(1, 2)  # (B, H, T, d)
        return X.reshape(B * self.num_heads, T, -1)

    def transpose_output(self, X: torch.Tensor) -> torch.Tensor:
        """The inverse of :meth:`transpose_qkv`: ``(B * H, T, d)`` -> ``(B, T, H * d)``."""
        BH, T, d = X.shape
        B = BH // self.num_heads
        return X.reshape(B, self.num_heads, T, d).transpose(1, 2).reshape(B, T, -1)

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
            values: ``(B, Tk, value_size)``.
            valid_lens: ``(B,)`` or ``(B, Tq)``; keys ``j < valid_len`` are valid.

        Returns:
            ``(B, Tq, num_hiddens)``.
        """
        for name, x in (("queries", queries), ("keys", keys), ("values", values)):
            if not isinstance(x, torch.Tensor) or x.ndim != 3:
                got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
                raise ValueError(f"{name} must be (B, T, features), got {got}")
        q = self.transpose_qkv(self.W_q(queries))  # (B*H, Tq, d)
        k = self.transpose_qkv(self.W_k(keys))  # (B*H, Tk, d)
        v = self.transpose_qkv(self.W_v(values))  # (B*H, Tk, d)
        if valid_lens is not None:  # each example's lengths, once per head
            valid_lens = torch.as_tensor(valid_lens, device=queries.device)
            if valid_lens.ndim not in (1, 2) or valid_lens.shape[0] != queries.shape[0]:
                raise ValueError(
                    f"valid_lens must be (B,) or (B, Tq) with B={queries.shape[0]}, got "
                    f"{tuple(valid_lens.shape)}"
                )
            valid_lens = torch.repeat_interleave(valid_lens, self.num_heads, dim=0)
        out = self.attention(q, k, v, valid_lens)  # (B*H, Tq, d)
        return self.W_o(self.transpose_output(out))  # (B, Tq, num_hiddens)


class PositionalEncoding(nn.Module):
    """Sinusoidal positional encoding, added to the input, then dropout (d2l's class).

    Position ``i``, feature pair ``(2j, 2j+1)``: ``P[i, 2j] = sin(i / 10000^(2j/d))`` and
    ``P[i, 2j+1] = cos(i / 10000^(2j/d))`` for ``d = num_hiddens``, in float32, the same
    numbers as d2l's. Unlike d2l's, ``P`` is a buffer (it moves with ``.to()``; not saved
    in the state dict, as d2l saves none), an odd ``num_hiddens`` works (the last feature
    is a sine), and an input longer than ``max_len`` is a ``ValueError``.

    Args:
        num_hiddens: ``d``, the feature width of the inputs.
        dropout: on the sum, in training.
        max_len: the longest sequence it encodes.
    """

    P: torch.Tensor

    def __init__(self, num_hiddens: int, dropout: float, max_len: int = 1000) -> None:
        super().__init__()
        for name, n in (("num_hiddens", num_hiddens), ("max_len", max_len)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ValueError(f"{name} must be a positive int, got {n!r}")
        self.dropout = nn.Dropout(dropout)
        angle = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
            10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens
        )  # (max_len, ceil(d / 2))
        P = torch.zeros((1, max_len, num_hiddens))
        P[:, :, 0::2] = torch.sin(angle)
        P[:, :, 1::2] = torch.cos(angle[:, : num_hiddens // 2])
        self.register_buffer("P", P, persistent=False)

    def forward(self, X: torch.Tensor) -> torch.Tensor:
        """``X (B, T, num_hiddens)`` -> ``dropout(X + P[:T])``, same shape."""
        if X.ndim != 3 or X.shape[-1] != self.P.shape[-1] or X.shape[1] > self.P.shape[1]:
            raise ValueError(
                f"expected X (B, T, {self.P.shape[-1]}) with T <= max_len={self.P.shape[1]}, "
                f"got {tuple(X.shape)}"
            )
        return self.dropout(X + self.P[:, : X.shape[1], :].to(X.device))
