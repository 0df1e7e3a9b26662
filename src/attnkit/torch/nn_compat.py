"""A drop-in ``torch.nn.MultiheadAttention`` that runs on attnkit's attention.

:class:`MultiheadAttention` (torch's spelling) *is* an ``nn.MultiheadAttention``: it
subclasses it and replaces only ``forward``. So the constructor, the parameters
(``in_proj_weight``/``in_proj_bias``, or ``q_proj_weight``/``k_proj_weight``/
``v_proj_weight`` when ``kdim``/``vdim`` differ; ``bias_k``, ``bias_v``, ``out_proj``),
the state_dict keys, the initialisation (the same draws from the same seed) and every
attribute torch's own code reads (``batch_first``, ``_qkv_same_embed_dim``,
``merge_masks``) are torch's: its checkpoints load as they are, and
``nn.TransformerEncoderLayer``/``nn.Transformer`` accept it as ``self_attn``.

``forward`` takes torch's arguments with torch's defaults and masks in torch's polarity
(bool True = NOT allowed, or float added to the scores) and returns what torch returns,
computed by :func:`attnkit.torch.attention` (fused, masks included; the weights, when
``need_weights=True``, from the fused kernel's log-sum-exp). Where attnkit's documented
policy differs from torch:

- a query whose every key is masked gets output 0, weights 0 and zero gradients (torch:
  NaN);
- the returned weights are those before dropout (torch, in training: after);
- bad shapes and dtypes raise ``ValueError``/``TypeError`` naming them (torch:
  ``AssertionError``/``RuntimeError``).

``is_causal`` is torch's *hint* that ``attn_mask`` is the causal mask, and is read exactly
as torch reads it: it needs an ``attn_mask`` (else an error); without a
``key_padding_mask`` and with ``need_weights=False`` the mask is then not read and
top-left causal attention runs (query ``i`` sees keys ``j <= i``, also when
``Tq != Tk``); otherwise ``attn_mask`` itself is applied. A KV cache (``cache=``, from
:meth:`MultiheadAttention.init_cache`) is attnkit's addition; with one, ``attn_mask``
covers every cached key and is always applied as given.

In eval mode under ``torch.no_grad()``, ``nn.TransformerEncoderLayer`` (and so
``nn.TransformerEncoder``) may skip ``self_attn.forward`` altogether and run torch's fused
inference kernel on the same parameters; that is torch's code path, as with
``nn.MultiheadAttention`` itself.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from ._decode import through_cache
from .cache import KVCache
from .functional import attention
from .interop import batch_major

__all__ = ["MultiheadAttention", "swap_attention"]

Tensor = torch.Tensor


class MultiheadAttention(nn.MultiheadAttention):
    """``torch.nn.MultiheadAttention`` with attnkit's ``forward`` (see the module docstring).

    Construct it exactly as ``nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0,
    bias=True, add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None,
    batch_first=False, device=None, dtype=None)``, or from an existing layer with
    :meth:`from_torch`; :func:`swap_attention` swaps it into a model.
    """

    @classmethod
    def from_torch(
        cls, m: nn.MultiheadAttention, *, share_parameters: bool = False
    ) -> MultiheadAttention:
        """This class with ``m``'s configuration, weights, dtype, device and training mode.

        Args:
            m: an ``nn.MultiheadAttention``.
            share_parameters: hold ``m``'s very ``Parameter`` objects (no copy: an optimizer
                built over ``m`` keeps training the new layer) instead of copies.

        Nothing is drawn from torch's RNG: the layer is built on the meta device first.
        """
        if not isinstance(m, nn.MultiheadAttention):
            raise TypeError(f"expected torch.nn.MultiheadAttention, got {type(m).__name__}")
        ref = m.out_proj.weight
        new = cls(
            m.embed_dim, m.num_heads, dropout=m.dropout, bias=m.in_proj_bias is not None,
            add_bias_kv=m.bias_k is not None, add_zero_attn=m.add_zero_attn, kdim=m.kdim,
            vdim=m.vdim, batch_first=m.batch_first, device="meta", dtype=ref.dtype,
        )
        if share_parameters:
            for name, p in m.named_parameters():
                owner, _, leaf = name.rpartition(".")
                setattr(new.get_submodule(owner), leaf, p)
        else:
            new.to_empty(device=ref.device)
            new.load_state_dict(m.state_dict())
            for p_new, p in zip(new.parameters(), m.parameters()):
                p_new.requires_grad_(p.requires_grad)
        return new.train(m.training)

    def init_cache(
        self,
        batch_size: int,
        capacity: int,
        *,
        cross: bool = False,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> KVCache:
        """A :class:`KVCache` ``(B, H, capacity, E // H)`` for :meth:`forward`'s ``cache``.

        A self-attention cache appends each call's keys/values and attends over all of
        them; ``cross=True`` projects ``key``/``value`` on its first use and reuses them.
        Device and dtype default to the layer's.
        """
        w = self.out_proj.weight
        return KVCache(
            batch_size=batch_size, num_kv_heads=self.num_heads, capacity=capacity,
            head_dim=self.head_dim, cross=cross,
            device=w.device if device is None else device,
            dtype=w.dtype if dtype is None else dtype,
        )

    def forward(  # type: ignore[override]
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None = None,
        need_weights: bool = True,
        attn_mask: Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
        *,
        cache: KVCache | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """torch's ``forward``, on attnkit's attention.

        Args:
            query: ``(Tq, B, E)``, ``(B, Tq, E)`` when ``batch_first``, or ``(Tq, E)``
                unbatched.
            key: ``(Tk, B, kdim)`` in the same layout.
            value: ``(Tk, B, vdim)`` in the same layout.
            key_padding_mask: ``(B, Tk)`` (``(Tk,)`` unbatched); bool True = ignore that
                key, or float added to the scores.
            need_weights: also return the attention weights (pre-dropout).
            attn_mask: ``(Tq, Tk)`` or ``(B*H, Tq, Tk)`` (``(H, Tq, Tk)`` unbatched); bool
                True = NOT allowed, or float added to the scores.
            average_attn_weights: weights ``(B, Tq, Tk)`` averaged over heads, else
                ``(B, H, Tq, Tk)`` (without ``B`` unbatched).
            is_causal: torch's hint that ``attn_mask`` is causal (module docstring).
            cache: an attnkit :class:`KVCache` from :meth:`init_cache` (keyword only).

        Returns:
            ``(out, weights or None)``, ``out`` in ``query``'s layout.
        """
        batched = _check_inputs(self, query, key, value)
        self_attention = query is key and key is value
        if not batched:
            query, key, value = query[None], key[None], value[None]
        elif not self.batch_first:
            query, key, value = batch_major(query, key, value)  # (B, T, E) views
        B, Tq, E = query.shape
        if cache is None:
            out, weights = self._attend(query, key, value, key_padding_mask, need_weights,
                                        attn_mask, is_causal, None, self_attention, batched)
        else:
            # A failing call takes the positions it appended back out (so a retry does not
            # attend to them twice); positions past `length` are never read.
            length = cache.length
            try:
                out, weights = self._attend(query, key, value, key_padding_mask, need_weights,
                                            attn_mask, is_causal, cache, self_attention,
                                            batched)
            except BaseException:
                cache.length = length
                raise
        # (B, H, Tq, D) -> the caller's layout, contiguous as torch returns it.
        if batched and not self.batch_first:
            out = out.permute(2, 0, 1, 3).reshape(Tq, B, E)
        else:
            out = out.transpose(1, 2).reshape(B, Tq, E)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)
        if weights is not None and average_attn_weights:
            weights = weights.mean(dim=1)  # (B, Tq, Tk)
        if not batched:
            out = out[0]
            weights = None if weights is None else weights[0]
        return out, weights

    def _attend(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        key_padding_mask: Tensor | None,
        need_weights: bool,
        attn_mask: Tensor | None,
        is_causal: bool,
        cache: KVCache | None,
        self_attention: bool,
        batched: bool,
    ) -> tuple[Tensor, Tensor | None]:
        """Batch-major ``(B, T, E)`` inputs -> ``(out (B, H, Tq, D), weights or None)``."""
        B, Tq, _ = query.shape
        if is_causal and attn_mask is None:
            raise ValueError(
                "is_causal=True is a hint that attn_mask is the causal mask, so it needs "
                "attn_mask (as in torch.nn.MultiheadAttention); build one with "
                "nn.Transformer.generate_square_subsequent_mask(T)"
            )
        # torch trusts the hint (and reads no mask) exactly here; its causal is top-left.
        trust_hint = is_causal and key_padding_mask is None and not need_weights \
            and cache is None
        q, k, v = self._project(query, key, value, cache, self_attention)
        if cache is not None:  # attnkit's MultiHeadAttention's rule
            k, v = through_cache(cache, k, v)  # (B, H, cached, D)
        Tk = k.shape[2]
        allowed, bias = _torch_masks(key_padding_mask, attn_mask, B, self.num_heads, Tq, Tk,
                                  batched)
        if trust_hint:
            allowed = bias = None
        # Extra keys come last; a trusted hint's top-left causal spans them too, as torch's.
        k, v, allowed, bias = self._extra_keys(k, v, allowed, bias)
        return attention(
            q, k, v, mask=allowed, bias=bias, causal="top_left" if trust_hint else False,
            need_weights=need_weights, dropout_p=self.dropout if self.training else 0.0,
        )

    def _project(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        cache: KVCache | None,
        self_attention: bool,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """q ``(B, H, Tq, D)``, and k, v ``(B, H, Tk, D)`` (None when a filled
        cross-attention cache holds them). Biases in another dtype than the input are
        cast to it, as torch's layer runs them."""
        E = self.embed_dim
        if self._qkv_same_embed_dim:
            w_q, w_k, w_v = self.in_proj_weight.chunk(3)
        else:
            w_q, w_k, w_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        b = self.in_proj_bias
        if b is not None and b.dtype != query.dtype:
            b = b.to(query.dtype)
        b_q, b_k, b_v = (None, None, None) if b is None else b.chunk(3)
        if self_attention and self._qkv_same_embed_dim and cache is None:
            # One GEMM against the packed weight, as torch does for self-attention.
            qkv = F.linear(query, self.in_proj_weight, b)  # (B, T, 3E)
            return tuple(self._heads(x) for x in qkv.split(E, dim=-1))  # type: ignore[return-value]
        q = self._heads(F.linear(query, w_q, b_q))
        if cache is not None and cache.cross and cache.length > 0:
            if key.shape[:2] != (query.shape[0], cache.length):
                raise ValueError(
                    f"cross-attention cache holds (B, Tk) = ({query.shape[0]}, "
                    f"{cache.length}) positions, key {tuple(key.shape)} does not match"
                )
            return q, None, None
        k = self._heads(F.linear(key, w_k, b_k))
        v = self._heads(F.linear(value, w_v, b_v))
        return q, k, v

    def _heads(self, x: Tensor) -> Tensor:
        """``(B, T, E)`` -> ``(B, H, T, E // H)`` (a view)."""
        return x.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)

    def _extra_keys(
        self, k: Tensor, v: Tensor, allowed: Tensor | None, bias: Tensor | None,
    ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
        """``add_bias_kv`` (the learned ``bias_k``/``bias_v`` position) and then
        ``add_zero_attn`` (an all-zero position) appended after the keys and values, as
        torch appends them, each allowed for every query."""
        extra_k, extra_v = [], []
        if self.bias_k is not None and self.bias_v is not None:
            B = k.shape[0]
            extra_k.append(self._heads(self.bias_k).expand(B, -1, -1, -1))
            extra_v.append(self._heads(self.bias_v).expand(B, -1, -1, -1))
        if self.add_zero_attn:
            extra_k.append(k.new_zeros(k.shape[:2] + (1, k.shape[3])))
            extra_v.append(v.new_zeros(v.shape[:2] + (1, v.shape[3])))
        n = len(extra_k)
        if n == 0:
            return k, v, allowed, bias
        k = torch.cat([k, *extra_k], dim=2)
        v = torch.cat([v, *extra_v], dim=2)
        if allowed is not None:
            allowed = torch.cat([allowed, allowed.new_ones(allowed.shape[:-1] + (n,))], dim=-1)
        if bias is not None:
            bias = F.pad(bias, (0, n))
        return k, v, allowed, bias


def _check_inputs(m: nn.MultiheadAttention, query: Tensor, key: Tensor, value: Tensor) -> bool:
    """Shapes of ``query``/``key``/``value`` (``ValueError`` naming them); True = batched."""
    for name, x in (("query", query), ("key", key), ("value", value)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}")
    shapes = f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    if query.ndim not in (2, 3) or key.ndim != query.ndim or value.ndim != query.ndim:
        raise ValueError(
            f"expected query, key and value all 3-D (batched) or all 2-D (unbatched), got "
            f"{shapes}"
        )
    batched = query.ndim == 3
    seq, batch = (1, 0) if batched and m.batch_first else (0, 1)
    layout = ("(B, T, " if m.batch_first else "(T, B, ") if batched else "(T, "
    widths = ((query, m.embed_dim), (key, m.kdim), (value, m.vdim))
    bad_width = any(x.shape[-1] != w for x, w in widths)
    bad_batch = batched and not query.shape[batch] == key.shape[batch] == value.shape[batch]
    if bad_width or bad_batch or key.shape[seq] != value.shape[seq]:
        raise ValueError(
            f"expected query {layout}{m.embed_dim}), key {layout}{m.kdim}) and value "
            f"{layout}{m.vdim}) with one B and one Tk for key and value, got {shapes}"
        )
    return batched


def _torch_masks(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    B: int,
    H: int,
    Tq: int,
    Tk: int,
    batched: bool,
) -> tuple[Tensor | None, Tensor | None]:
    """torch's masks (True = NOT allowed, or additive float) as attnkit's ``(mask, bias)``
    (True = may attend; float added), both broadcastable to ``(B, H, Tq, Tk)``."""
    allowed: Tensor | None = None
    bias: Tensor | None = None

    def add(m: Tensor) -> None:
        nonlocal allowed, bias
        if m.dtype == torch.bool:
            allowed = ~m if allowed is None else allowed & ~m
        else:
            bias = m if bias is None else bias + m

    if key_padding_mask is not None:
        kpm = _check_mask("key_padding_mask", key_padding_mask)
        want = (B, Tk) if batched else (Tk,)
        if tuple(kpm.shape) != want:
            raise ValueError(
                f"key_padding_mask must be {'(B, Tk)' if batched else '(Tk,)'} = {want}, got "
                f"{tuple(kpm.shape)}"
            )
        add(kpm.reshape(B, 1, 1, Tk))
    if attn_mask is not None:
        am = _check_mask("attn_mask", attn_mask)
        heads = (B * H, "B*H") if batched else (H, "H")
        if tuple(am.shape) == (Tq, Tk):
            add(am)
        elif tuple(am.shape) == (heads[0], Tq, Tk):
            add(am.reshape(B, H, Tq, Tk))  # batch-major, as torch lays out (B*H)
        else:
            raise ValueError(
                f"attn_mask must be (Tq, Tk) = {(Tq, Tk)} or ({heads[1]}, Tq, Tk) = "
                f"{(heads[0], Tq, Tk)}, got {tuple(am.shape)}"
            )
    return allowed, bias


def _check_mask(name: str, m: object) -> Tensor:
    if not isinstance(m, torch.Tensor):
        raise TypeError(f"{name} must be a tensor, got {type(m).__name__}")
    if m.dtype != torch.bool and not m.is_floating_point():
        raise TypeError(
            f"{name} must be bool (True = ignore) or floating point (added to the scores), "
            f"got dtype {m.dtype}"
        )
    return m


def swap_attention(model: nn.Module) -> dict[str, nn.MultiheadAttention]:
    """Replace every ``torch.nn.MultiheadAttention`` inside ``model`` by attnkit's
    :class:`MultiheadAttention`, in place.

    The new layers hold the old layers' very parameters (no copy: same weights, device,
    dtype, and an optimizer built before the swap keeps training them) and their training
    mode. Only layers whose type is exactly ``nn.MultiheadAttention`` are swapped
    (subclasses, whose ``forward`` may differ, are left alone); a layer registered under
    several names becomes one new layer. Hooks registered on the old layers are not moved.

    Returns:
        ``{qualified name: the replaced nn.MultiheadAttention}``, in module order.
    """
    if type(model) is nn.MultiheadAttention:
        raise TypeError(
            "model is itself an nn.MultiheadAttention and cannot be replaced in place; use "
            "attnkit.torch.MultiheadAttention.from_torch(model, share_parameters=True)"
        )
    found = [
        (f"{prefix}.{name}" if prefix else name, parent, name, child)
        for prefix, parent in model.named_modules(remove_duplicate=False)
        for name, child in parent.named_children()
        if type(child) is nn.MultiheadAttention
    ]
    new: dict[int, MultiheadAttention] = {}
    replaced: dict[str, nn.MultiheadAttention] = {}
    for qualified, parent, name, child in found:
        if id(child) not in new:
            new[id(child)] = MultiheadAttention.from_torch(child, share_parameters=True)
        setattr(parent, name, new[id(child)])
        replaced[qualified] = child
    return replaced
