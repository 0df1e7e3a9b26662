"""Multi-head attention as an ``nn.Module``: what ``torch.nn.MultiheadAttention`` does (and
converts to and from it), plus GQA/MQA, free head dims, bottom-right causal and sliding
windows, d2l ``valid_lens``, and a KV cache for decoding.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from ..numpy.mha_params import MultiHeadParams, head_sizes
from ..spec import check_dropout, check_softcap
from ._checks import check_padding_mask
from ._decode import decode_step, through_cache
from ._triton_path import triton_decode
from .cache import KVCache
from .functional import attention
from .interop import Projections, batch_major, to_torch, torch_mha_parts
from .masks import Window

__all__ = ["MultiHeadAttention", "from_torch"]


class MultiHeadAttention(nn.Module):
    """Multi-head attention, batch-first, with GQA/MQA, free head dims and a KV cache.

    Args:
        embed_dim: ``E``, width of the queries and of the output.
        num_heads: ``H`` query heads.
        num_kv_heads: ``Hkv`` key/value heads (default ``H``; 1 = MQA).
        head_dim: ``Dk`` (default ``E // H``; give it and ``E`` need not divide by ``H``).
        v_head_dim: ``Dv`` (default ``Dk``).
        kdim, vdim: widths of the key and value inputs (default ``E``).
        bias: biases on all four projections.
        dropout: on the attention weights, in training.
        softcap: logit soft-capping ``softcap * tanh(s / softcap)`` (Gemma 2); None = off.
        sinks: learn one attention-sink logit per query head (GPT-OSS): the parameter
            ``sinks (H,)``, zeros-initialised.
        batch_first: inputs and output are ``(B, T, E)`` (default); False = ``(T, B, E)``,
            as ``nn.MultiheadAttention``'s default. Masks, ``valid_lens`` and caches are
            indexed by batch first either way.
        device, dtype: of the parameters.

    Submodules: ``q_proj`` (E -> H*Dk), ``k_proj`` (kdim -> Hkv*Dk), ``v_proj``
    (vdim -> Hkv*Dv), ``out_proj`` (H*Dv -> E); Xavier-uniform weights, zero biases.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *d2l_args: object,  # only to name the right class to d2l users (error below)
        num_kv_heads: int | None = None,
        head_dim: int | None = None,
        v_head_dim: int | None = None,
        kdim: int | None = None,
        vdim: int | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        softcap: float | None = None,
        sinks: bool = False,
        batch_first: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        if d2l_args:
            raise TypeError(
                f"MultiHeadAttention(embed_dim, num_heads, *, ...) got {2 + len(d2l_args)} "
                f"positional arguments {(embed_dim, num_heads, *d2l_args)}: that is d2l's "
                "signature (num_hiddens, num_heads, dropout, bias=False); for d2l's class use "
                "attnkit.torch.d2l.MultiHeadAttention, or pass dropout=... as a keyword here"
            )
        super().__init__()
        H, Hkv, head_dim = head_sizes(embed_dim, num_heads, num_kv_heads, head_dim)
        self.softcap = check_softcap(softcap)
        self.embed_dim = embed_dim
        self.num_heads = H
        self.num_kv_heads = Hkv
        self.head_dim = head_dim
        self.v_head_dim = head_dim if v_head_dim is None else v_head_dim
        self.kdim = embed_dim if kdim is None else kdim
        self.vdim = embed_dim if vdim is None else vdim
        self.dropout = check_dropout(dropout)
        self.batch_first = bool(batch_first)
        kw = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, H * head_dim, bias=bias, **kw)
        self.k_proj = nn.Linear(self.kdim, Hkv * head_dim, bias=bias, **kw)
        self.v_proj = nn.Linear(self.vdim, Hkv * self.v_head_dim, bias=bias, **kw)
        self.out_proj = nn.Linear(H * self.v_head_dim, embed_dim, bias=bias, **kw)
        self.sinks = nn.Parameter(torch.zeros(H, **kw)) if sinks else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, zero biases and sinks."""
        for lin in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(lin.weight)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        if self.sinks is not None:
            nn.init.zeros_(self.sinks)

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"v_head_dim={self.v_head_dim}, dropout={self.dropout}"
            + (f", softcap={self.softcap}" if self.softcap is not None else "")
            + (", sinks=True" if self.sinks is not None else "")
            + ("" if self.batch_first else ", batch_first=False")
        )

    # -- forward -------------------------------------------------------------------------

    def _heads(self, x: torch.Tensor, heads: int, dim: int) -> torch.Tensor:
        """``(B, T, heads*dim)`` -> ``(B, heads, T, dim)`` (a view)."""
        B, T, _ = x.shape
        return x.view(B, T, heads, dim).transpose(1, 2)

    def _project(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        cache: KVCache | None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """q ``(B, H, Tq, Dk)`` and this call's k/v ``(B, Hkv, Tk, Dk/Dv)``; k and v are
        None when a filled cross-attention cache already holds them."""
        B, H, Hkv = query.shape[0], self.num_heads, self.num_kv_heads
        Dk, Dv = self.head_dim, self.v_head_dim
        self_attention = (key is None or key is query) and (value is None or value is query)
        # Stacking the weights costs a copy of them per call: worth it for a training or
        # prefill batch (one GEMM, one input gradient), not for a one-token decoding step.
        if self_attention and cache is None and self.kdim == self.vdim == self.embed_dim:
            return self._packed_qkv(query)
        q = self._heads(self.q_proj(query), H, Dk)
        if cache is not None and cache.cross:
            if cache.length > 0:
                if key is not None and (key.ndim != 3 or key.shape[:2] != (B, cache.length)):
                    raise ValueError(
                        f"cross-attention cache holds (B, Tk) = ({B}, {cache.length}) "
                        f"positions, key {tuple(key.shape)} does not match"
                    )
                return q, None, None  # reuse the cached projections
            if key is None:
                raise ValueError("an empty cross-attention cache needs `key` to fill it")
        key = query if key is None else key
        value = key if value is None else value
        if key is not query or self.kdim != self.embed_dim:  # query is checked already
            self._check_input("key", key, self.kdim)
        if value is not query or self.vdim != self.embed_dim:
            self._check_input("value", value, self.vdim)
        if key.shape[:2] != value.shape[:2] or key.shape[0] != B:
            raise ValueError(
                f"query {tuple(query.shape)}, key {tuple(key.shape)} and value "
                f"{tuple(value.shape)} must share B, and key/value must share Tk"
            )
        k = self._heads(self.k_proj(key), Hkv, Dk)
        v = self._heads(self.v_proj(value), Hkv, Dv)
        return q, k, v

    def _packed_qkv(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention projections as one matmul against the stacked weights (one GEMM
        and one input gradient instead of three; the stacking copies only the weights).

        Returns q ``(B, H, T, Dk)``, k ``(B, Hkv, T, Dk)``, v ``(B, Hkv, T, Dv)`` (views).
        """
        H, Hkv, Dk, Dv = self.num_heads, self.num_kv_heads, self.head_dim, self.v_head_dim
        projs = (self.q_proj, self.k_proj, self.v_proj)
        w = torch.cat([p.weight for p in projs])
        b = None if self.q_proj.bias is None else torch.cat([p.bias for p in projs])
        qkv = F.linear(x, w, b)  # (B, T, H*Dk + Hkv*Dk + Hkv*Dv)
        q, k, v = qkv.split([H * Dk, Hkv * Dk, Hkv * Dv], dim=-1)
        return self._heads(q, H, Dk), self._heads(k, Hkv, Dk), self._heads(v, Hkv, Dv)

    def _check_input(self, name: str, x: torch.Tensor, width: int) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
        if x.ndim != 3 or x.shape[-1] != width:
            raise ValueError(f"{name} must be (B, T, {width}), got {tuple(x.shape)}")

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None = None,
        value: torch.Tensor | None = None,
        *d2l_args: object,  # only to name the right class to d2l users (error below)
        mask: torch.Tensor | None = None,
        bias: torch.Tensor | None = None,
        valid_lens: torch.Tensor | None = None,
        causal: bool | str = False,
        window: Window | None = None,
        need_weights: bool = False,
        average_weights: bool = True,
        cache: KVCache | None = None,
        segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Args:
            query: ``(B, Tq, E)`` (``(Tq, B, E)`` when ``batch_first=False``).
            key: ``(B, Tk, kdim)``; None = self-attention on ``query``.
            value: ``(B, Tk, vdim)``; None = ``key``.
            mask: bool, True = may attend, ``(Tq, Tk)`` or 4-D broadcastable to
                ``(B, H, Tq, Tk)`` (3-D is rejected as ambiguous).
            bias: float, same shapes, added to the scaled scores
                (``nn.MultiheadAttention``'s float ``attn_mask``).
            valid_lens: ``(B,)`` or ``(B, Tq)``: keys ``j < valid_len`` are valid.
            causal: True/``"bottom_right"`` (with a cache: over everything cached), or
                ``"top_left"`` (SDPA's ``is_causal``).
            window: ``(left, right)`` band around the bottom-right diagonal.
            need_weights: also return the attention weights.
            average_weights: average them over heads to ``(B, Tq, Tk)``; else
                ``(B, H, Tq, Tk)``.
            cache: from :meth:`init_cache`. A self-attention cache appends this call's
                keys/values and attends over all of them (``Tk`` = positions cached); a
                cross-attention cache projects ``key``/``value`` on its first use and
                reuses them afterwards (``key`` may then be None).
            segment_ids: ``(B, T)`` for self-attention or ``(q_ids (B, Tq), kv_ids
                (B, Tk))``: packed documents and padding (id < 0), see
                :func:`attnkit.torch.attention`.
            padding_mask: ``(B, Tk)`` bool or 0/1 over the keys this call projects, True
                (1) = a real token, False (0) = padding that no query attends (the
                ``attention_mask`` convention of transformers). With a cache, the cache
                keeps it for every position it holds: pass it with the left-padded
                prompt, and later steps (whose tokens are real) need not pass it again;
                the step's key mask is then a view of the cache's own buffer.

        Returns:
            ``(out (B, Tq, E) (or (Tq, B, E)), weights or None)``.
        """
        if d2l_args:
            raise TypeError(
                f"MultiHeadAttention.forward(query, key, value, *, valid_lens=...) got "
                f"{3 + len(d2l_args)} positional arguments: pass valid_lens=... as a keyword "
                "(the result is (out, weights)), or use attnkit.torch.d2l.MultiHeadAttention, "
                "d2l's class (forward(queries, keys, values, valid_lens) -> out)"
            )
        self._check_input("query", query, self.embed_dim)
        if not self.batch_first:  # (T, B, E) -> (B, T, E) views; `key is query` survives
            query, key, value = batch_major(query, key, value)
        B = query.shape[0]
        for name, m in (("mask", mask), ("bias", bias)) if mask is not None or bias is not None \
                else ():
            if m is not None and m.ndim not in (2, 4):
                # (B, Tq, Tk) would silently broadcast B against the head axis.
                raise ValueError(
                    f"{name} must be (Tq, Tk) or (B|1, H|1, Tq, Tk), got {tuple(m.shape)}; "
                    f"for a per-batch (B, Tq, Tk) {name} pass {name}[:, None]"
                )
        variants = {"segment_ids": segment_ids, "padding_mask": padding_mask}
        if cache is None:
            return self._attend(query, key, value, None, mask, bias, valid_lens, causal,
                                window, need_weights, average_weights, **variants)
        self._check_cache(cache, B)
        # The append comes before the mask checks (they need Tk = positions cached): a
        # call that raises afterwards takes its positions back out, so that a retry does
        # not attend to them twice. Positions past `length` are never read.
        length = cache.length
        try:
            if query.shape[1] == 1 and mask is None and bias is None and window is None \
                    and not need_weights and segment_ids is None and padding_mask is None \
                    and (key is None or key is query) and (value is None or value is query) \
                    and (causal is False or causal is True
                         or (type(causal) is str and causal == "bottom_right")) \
                    and self.softcap is None and self.sinks is None and not cache.cross \
                    and self.kdim == self.vdim == self.embed_dim \
                    and not (self.training and self.dropout) and not query.is_cuda:
                # A decoding step: one new position over everything cached (_decode.py).
                out = decode_step(self, query, cache, valid_lens, causal)
                return (out if self.batch_first else out.transpose(0, 1)), None
            return self._attend(query, key, value, cache, mask, bias, valid_lens, causal,
                                window, need_weights, average_weights, **variants)
        except BaseException:
            cache.length = length
            raise

    def _attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor | None,
        value: torch.Tensor | None,
        cache: KVCache | None,
        mask: torch.Tensor | None,
        bias: torch.Tensor | None,
        valid_lens: torch.Tensor | None,
        causal: bool | str,
        window: Window | None,
        need_weights: bool,
        average_weights: bool,
        segment_ids: torch.Tensor | tuple[torch.Tensor, torch.Tensor] | None = None,
        padding_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """:meth:`forward` after its argument checks."""
        B, Tq, _ = query.shape
        H, Dv = self.num_heads, self.v_head_dim
        q, k, v = self._project(query, key, value, cache)  # (B, H|Hkv, T, Dk|Dv)
        if padding_mask is not None:
            padding_mask = check_padding_mask(padding_mask, B, None if k is None else k.shape[2])
        if cache is not None:
            k, v = through_cache(cache, k, v, padding_mask)  # (B, Hkv, cached, D)
            keys = cache.padding_mask()  # (B, 1, 1, Tk) view, or None
        else:
            keys = None if padding_mask is None else padding_mask[:, None, None, :]
        if keys is not None:
            mask = keys if mask is None else mask & keys
        out = weights = None
        bottom_right = causal is True or causal == "bottom_right" or (not causal and Tq == 1)
        if cache is not None and q.is_cuda and not cache.cross and bottom_right \
                and not need_weights and mask is None and bias is None and valid_lens is None \
                and window is None and self.softcap is None and self.sinks is None \
                and segment_ids is None and not (self.training and self.dropout > 0):
            # Decoding: the Triton kernel reads the cache buffers in place (None if it
            # cannot take the call).
            out = triton_decode(q, cache.k, cache.v, cache.length)
        if out is None:
            out, weights = attention(
                q, k, v, mask=mask, bias=bias, valid_lens=valid_lens, causal=causal,
                window=window, need_weights=need_weights, softcap=self.softcap,
                sinks=self.sinks, segment_ids=segment_ids,
                dropout_p=self.dropout if self.training else 0.0,
            )  # (B, H, Tq, Dv)
        out = self.out_proj(out.transpose(1, 2).reshape(B, Tq, H * Dv))  # (B, Tq, E)
        if not self.batch_first:
            out = out.transpose(0, 1)  # (Tq, B, E)
        if weights is not None and average_weights:
            weights = weights.mean(dim=1)  # (B, Tq, Tk)
        return out, weights

    # -- cache ---------------------------------------------------------------------------

    def init_cache(
        self,
        batch_size: int,
        capacity: int,
        *,
        cross: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """A preallocated :class:`KVCache` ``(B, Hkv, capacity, Dk/Dv)`` for this layer.

        ``cross=True`` makes a cross-attention cache: the first forward fills it with the
        projected ``key``/``value`` (``Tk <= capacity``), later forwards reuse them.
        Device and dtype default to the layer's parameters.
        """
        w = self.q_proj.weight
        return KVCache(
            batch_size=batch_size, num_kv_heads=self.num_kv_heads, capacity=capacity,
            head_dim=self.head_dim, v_head_dim=self.v_head_dim, cross=cross,
            device=w.device if device is None else device,
            dtype=w.dtype if dtype is None else dtype,
        )

    def _check_cache(self, cache: KVCache, B: int) -> None:
        want = (B, self.num_kv_heads, self.head_dim, self.v_head_dim)
        got = cache.sizes()
        if want != got:
            raise ValueError(
                f"cache (B, Hkv, Dk, Dv) = {got} does not match this layer and batch {want}"
            )

    # -- conversions ---------------------------------------------------------------------

    def _load(self, projections: Projections) -> None:
        """Copy weights ``(out, in)`` and biases into the four projections."""
        with torch.no_grad():
            for name, (weight, bias) in projections.items():
                lin: nn.Linear = getattr(self, name)
                lin.weight.copy_(weight)
                if lin.bias is not None:
                    lin.bias.copy_(bias)

    def to_numpy_params(self) -> MultiHeadParams:
        """The weights as :class:`attnkit.numpy.MultiHeadParams` (float64 copies)."""

        def arr(t: torch.Tensor | None) -> np.ndarray | None:
            return None if t is None else t.detach().cpu().double().numpy().copy()

        return MultiHeadParams.from_flat(
            arr(self.q_proj.weight.T), arr(self.k_proj.weight.T), arr(self.v_proj.weight.T),
            arr(self.out_proj.weight.T), num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads, b_q=arr(self.q_proj.bias),
            b_k=arr(self.k_proj.bias), b_v=arr(self.v_proj.bias), b_o=arr(self.out_proj.bias),
        )

    @classmethod
    def from_numpy_params(
        cls,
        params: MultiHeadParams,
        *,
        dropout: float = 0.0,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> MultiHeadAttention:
        """A layer holding ``params`` (biases must be all present or all absent)."""
        present = [b is not None for b in (params.b_q, params.b_k, params.b_v, params.b_o)]
        if any(present) and not all(present):
            raise ValueError("params must have all four biases or none")
        if params.out_dim != params.embed_dim:
            raise ValueError(
                f"out_dim {params.out_dim} != embed_dim {params.embed_dim} is not supported"
            )
        m = nn.utils.skip_init(  # no initialisation (nor draws from torch's RNG): loaded next
            cls, params.embed_dim, params.num_heads, num_kv_heads=params.num_kv_heads,
            head_dim=params.head_dim, v_head_dim=params.v_head_dim, kdim=params.kdim,
            vdim=params.vdim, bias=all(present), dropout=dropout,
            device=torch.get_default_device() if device is None else device,
            dtype=dtype if dtype is not None else torch.float64,
        )
        flat = params.to_flat()
        m._load({
            name: (torch.as_tensor(flat[w]).T, None if b not in flat else torch.as_tensor(flat[b]))
            for name, w, b in (("q_proj", "w_q", "b_q"), ("k_proj", "w_k", "b_k"),
                               ("v_proj", "w_v", "b_v"), ("out_proj", "w_o", "b_o"))
        })
        return m

    @classmethod
    def from_torch(cls, m: nn.MultiheadAttention) -> MultiHeadAttention:
        """A copy of ``torch.nn.MultiheadAttention`` ``m``: same outputs and weights, dtype,
        device, dropout, ``batch_first`` and training mode. Leaves torch's RNG alone (the
        parameters are allocated uninitialised, then copied)."""
        config, projections = torch_mha_parts(m)
        ours = nn.utils.skip_init(cls, **config)
        ours._load(projections)
        ours.train(m.training)
        return ours

    def to_torch(self) -> nn.MultiheadAttention:
        """An equivalent ``torch.nn.MultiheadAttention`` (same ``batch_first``).
        See :func:`attnkit.torch.interop.to_torch`."""
        return to_torch(self)


def from_torch(m: nn.MultiheadAttention) -> MultiHeadAttention:
    """An attnkit :class:`MultiHeadAttention` with ``m``'s weights (copied), dtype, device,
    dropout and ``batch_first``: same outputs and weights for the same inputs."""
    return MultiHeadAttention.from_torch(m)
