"""Small look-alikes of the attention code people write outside transformers, for
``check_model`` on any PyTorch model: a GPT in the style of nanoGPT (SDPA with
``is_causal``), a ViT encoder (SDPA, no mask), an encoder-decoder with cross-attention and a
KV cache (bool padding masks, decoding steps), and a model built on ``nn.MultiheadAttention``
(``nn.TransformerEncoderLayer`` and a hand-written subclass).

Also the planted faults: attention functions with SDPA's signature that fill masked scores
with ``-1e9`` in the input's dtype (raises in float16) or drop the scale, and the same two
faults in a hand-written ``nn.MultiheadAttention`` subclass. All written for these tests.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS = 32, 4


# -- attention functions with SDPA's signature (the implementation under test) -----------------
def _keep(query: torch.Tensor, key: torch.Tensor, attn_mask: torch.Tensor | None,
          is_causal: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    L, S = query.shape[-2], key.shape[-2]
    keep = torch.ones(L, S, dtype=torch.bool, device=query.device)
    if is_causal:
        keep = keep.tril()
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = keep & attn_mask
        else:
            bias = attn_mask
    return keep, bias


def plain_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    """A correct hand-written SDPA: masked scores to -inf, softmax in float32."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    keep, bias = _keep(query, key, attn_mask, is_causal)
    s = (query.float() @ key.float().transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias.float()
    s = s.masked_fill(~keep, float("-inf"))
    w = torch.softmax(s, dim=-1).nan_to_num(0.0)
    return (w @ value.float()).to(query.dtype)


def fill_minus_1e9(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
    """Planted: masked scores filled with -1e9 in the input's own dtype."""
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    keep, bias = _keep(query, key, attn_mask, is_causal)
    s = (query @ key.transpose(-1, -2)) * scale
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep, -1e9)  # does not fit float16
    return torch.softmax(s, dim=-1) @ value


def unscaled(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
    """Planted: the scale dropped."""
    keep, bias = _keep(query, key, attn_mask, is_causal)
    s = query @ key.transpose(-1, -2)
    if bias is not None:
        s = s + bias
    s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ value


# -- a nanoGPT-style GPT -----------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, inline: bool = False) -> None:
        super().__init__()
        self.c_attn = nn.Linear(WIDTH, 3 * WIDTH)
        self.c_proj = nn.Linear(WIDTH, WIDTH)
        self.inline = inline  # attention written out, without SDPA

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, HEADS, C // HEADS).transpose(1, 2) for t in (q, k, v))
        if self.inline:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = torch.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
            y = att @ v
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=None,
                                               dropout_p=0.1 if self.training else 0.0,
                                               is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, inline: bool = False) -> None:
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = CausalSelfAttention(inline)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                 nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers: int = 3, vocab: int = 64, inline: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, WIDTH), nn.Embedding(64, WIDTH)
        self.blocks = nn.ModuleList(Block(i in inline) for i in range(layers))
        self.ln_f = nn.LayerNorm(WIDTH)
        self.lm_head = nn.Linear(WIDTH, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# -- a ViT-style encoder -----------------------------------------------------------------------
class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        x = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2])
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class EncoderBlock(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = Attention()
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 2 * WIDTH), nn.GELU(),
                                 nn.Linear(2 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class ViT(nn.Module):
    def __init__(self, layers: int = 2, patch: int = 4, image: int = 16) -> None:
        super().__init__()
        self.patch_embed = nn.Conv2d(3, WIDTH, patch, stride=patch)
        self.cls_token = nn.Parameter(torch.randn(1, 1, WIDTH) * 0.5)
        self.pos_embed = nn.Parameter(torch.randn(1, (image // patch) ** 2 + 1, WIDTH) * 0.5)
        self.blocks = nn.Sequential(*(EncoderBlock() for _ in range(layers)))
        self.head = nn.Linear(WIDTH, 10)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(pixel_values).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], 1) + self.pos_embed
        return self.head(self.blocks(x)[:, 0])


# -- an encoder-decoder with cross-attention and a KV cache ------------------------------------
class MultiHead(nn.Module):
    """Self- or cross-attention; with ``cache`` (a dict), keys and values of earlier steps
    are kept and this step's appended."""

    def __init__(self) -> None:
        super().__init__()
        self.q, self.k, self.v = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.o = nn.Linear(WIDTH, WIDTH)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], x.shape[1], HEADS, WIDTH // HEADS).transpose(1, 2)

    def forward(self, x: torch.Tensor, memory: torch.Tensor | None = None,
                keep: torch.Tensor | None = None, causal: bool = False,
                cache: dict | None = None) -> torch.Tensor:
        q = self.split(self.q(x))
        src = x if memory is None else memory
        k, v = self.split(self.k(src)), self.split(self.v(src))
        if cache is not None and memory is None:  # self-attention: grow the cache
            if "k" in cache:
                k, v = torch.cat([cache["k"], k], 2), torch.cat([cache["v"], v], 2)
            cache["k"], cache["v"] = k, v
        is_causal = causal and q.shape[2] == k.shape[2] and q.shape[2] > 1
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep, is_causal=is_causal)
        return self.o(y.transpose(1, 2).reshape(x.shape))


class EncoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.norm = MultiHead(), nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return x + self.self_attn(self.norm(x), keep=keep)


class DecoderLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.cross_attn = MultiHead(), MultiHead()
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, keep: torch.Tensor,
                cache: dict) -> torch.Tensor:
        x = x + self.self_attn(self.norm1(x), causal=True, cache=cache)
        return x + self.cross_attn(self.norm2(x), memory=memory, keep=keep)


class Seq2Seq(nn.Module):
    """``forward(src, src_keep, tgt, steps)``: encodes ``src`` (``src_keep`` ``(B, S)``,
    True = a real token), runs the decoder on ``tgt``, then ``steps`` greedy decoding steps
    of one token each with the KV cache; returns the tokens it chose."""

    def __init__(self, layers: int = 2, vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, WIDTH)
        self.encoder = nn.ModuleList(EncoderLayer() for _ in range(layers))
        self.decoder = nn.ModuleList(DecoderLayer() for _ in range(layers))
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, src: torch.Tensor, src_keep: torch.Tensor, tgt: torch.Tensor,
                steps: int = 2) -> torch.Tensor:
        keep = src_keep[:, None, None, :]  # (B, 1, 1, S): every query, every head
        memory = self.embed(src)
        for layer in self.encoder:
            memory = layer(memory, keep)
        caches: list[dict] = [{} for _ in self.decoder]
        out, x = [], tgt
        for _ in range(steps + 1):
            h = self.embed(x)
            for layer, cache in zip(self.decoder, caches):
                h = layer(h, memory, keep, cache)
            x = self.head(h[:, -1:]).argmax(-1)
            out.append(x)
        return torch.cat(out, 1)


# -- nn.MultiheadAttention ---------------------------------------------------------------------
class HandMHA(nn.MultiheadAttention):
    """An ``nn.MultiheadAttention`` whose forward is written by hand from its weights
    (batch_first, key_padding_mask and a bool attn_mask, True = may not attend); ``fill``
    and ``scaled`` plant the two faults."""

    def __init__(self, embed_dim: int, num_heads: int, fill: float = float("-inf"),
                 scaled: bool = True, **kw) -> None:
        super().__init__(embed_dim, num_heads, batch_first=True, **kw)
        self.fill, self.scaled = fill, scaled

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        N, L, E = query.shape
        H, d = self.num_heads, E // self.num_heads
        q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, -1) \
            if query is key else (F.linear(x, w, b) for x, w, b in zip(
                (query, key, value), self.in_proj_weight.chunk(3), self.in_proj_bias.chunk(3)))
        q, k, v = (t.reshape(N, -1, H, d).transpose(1, 2) for t in (q, k, v))
        s = q @ k.transpose(-1, -2)
        if self.scaled:
            s = s / math.sqrt(d)
        hide = torch.zeros(N, 1, L, k.shape[2], dtype=torch.bool, device=q.device)
        if attn_mask is not None:
            hide = hide | attn_mask
        if key_padding_mask is not None:
            hide = hide | key_padding_mask[:, None, None, :]
        s = s.masked_fill(hide, self.fill)
        y = torch.softmax(s.float(), -1).to(q.dtype) @ v
        return self.out_proj(y.transpose(1, 2).reshape(N, L, E)), None


class MHAModel(nn.Module):
    """Two ``nn.TransformerEncoderLayer`` (padding mask) and a causal layer of
    ``nn.MultiheadAttention`` (or ``HandMHA``, or ``planted`` in its place)."""

    def __init__(self, vocab: int = 64, planted: nn.Module | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, WIDTH)
        self.encoder = nn.ModuleList(
            nn.TransformerEncoderLayer(WIDTH, HEADS, 2 * WIDTH, dropout=0.0, batch_first=True)
            for _ in range(2))
        self.causal = planted if planted is not None else \
            nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.head = nn.Linear(WIDTH, vocab)

    def forward(self, ids: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.encoder:
            x = layer(x, src_key_padding_mask=pad)
        T = ids.shape[1]
        future = torch.ones(T, T, dtype=torch.bool, device=ids.device).triu(1)
        y, _ = self.causal(x, x, x, attn_mask=future, key_padding_mask=pad)
        return self.head(x + y)


# -- inputs ------------------------------------------------------------------------------------
def tokens(batch: int = 2, length: int = 10, vocab: int = 64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, length), generator=g)


def padded(batch: int = 2, length: int = 10) -> torch.Tensor:
    """``(B, T)`` True = a real token; row ``b`` has ``2 b`` pads on the right."""
    keep = torch.ones(batch, length, dtype=torch.bool)
    for b in range(1, batch):
        keep[b, length - 2 * b:] = False
    return keep


def build_gpt() -> GPT:
    """For ``attnkit check model lookalikes.py:build_gpt``: a seeded GPT."""
    torch.manual_seed(0)
    return GPT()


# -- flex_attention ------------------------------------------------------------------------------
class FlexAttention(nn.Module):
    """Causal self-attention by ``flex_attention``: a block mask from ``mask_mod`` and a
    distance penalty per head in ``score_mod`` (ALiBi-like)."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.register_buffer("slopes", torch.tensor([0.5, 0.25, 0.125, 0.0625]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        B, T, C = x.shape
        q, k, v = self.qkv(x).view(B, T, 3, HEADS, C // HEADS).permute(2, 0, 3, 1, 4)
        slopes = self.slopes

        def causal(b, h, i, j):
            return i >= j

        def alibi(score, b, h, i, j):
            return score - slopes[h] * (i - j)

        block = create_block_mask(causal, None, None, T, T, device=str(x.device))
        y = flex_attention(q, k, v, score_mod=alibi, block_mask=block)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class FlexModel(nn.Module):
    def __init__(self, layers: int = 2, vocab: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, WIDTH)
        self.layers = nn.ModuleList(FlexAttention() for _ in range(layers))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = x + layer(x)
        return x
