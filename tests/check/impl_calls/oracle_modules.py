"""Multi-head modules written as people write them, for the oracle comparison of
``check_multi_head``: correct ones in every structure the check reads (separate q/k/v/o,
fused qkv in two layouts and another order, GQA, nn.MultiheadAttention wrappers, causal,
cross-attention), correct ones it cannot read (rotary embeddings, a norm on q/k), and the
wrong ones a learner writes (no scale, 1/sqrt(E), a constant scale, a sigmoid, the softmax
over the queries, a fused qkv reshaped straight to (3, B, H, T, d), a batch_first=False
layer fed (B, T, E))."""

from __future__ import annotations

import math

import torch
from torch import nn


class Separate(nn.Module):
    """q/k/v/o as four nn.Linear; ``scale``: "d" (right), "none", "E", a number; ``weights``:
    "softmax" (right), "sigmoid", "queries" (softmax over dim=-2)."""

    def __init__(self, d_model, num_heads, bias=True, scale="d", weights="softmax"):
        super().__init__()
        self.num_heads, self.d_k = num_heads, d_model // num_heads
        self.w_q = nn.Linear(d_model, d_model, bias=bias)
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)
        self.how, self.weights, self.d_model = scale, weights, d_model

    def split(self, t):
        B, T, _ = t.shape
        return t.view(B, T, self.num_heads, self.d_k).transpose(1, 2)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        scores = q @ k.transpose(-2, -1)
        if self.how == "d":
            scores = scores / math.sqrt(self.d_k)
        elif self.how == "E":
            scores = scores / math.sqrt(self.d_model)
        elif self.how != "none":
            scores = scores * self.how
        if self.weights == "sigmoid":
            p = torch.sigmoid(scores)
        else:
            p = scores.softmax(dim=-1 if self.weights == "softmax" else -2)
        out = (p @ v).transpose(1, 2).contiguous().view(B, T, E)
        return self.w_o(out)


def separate_no_bias(E, H):
    return Separate(E, H, bias=False)


def no_scale(E, H):
    return Separate(E, H, scale="none")


def width_scale(E, H):
    return Separate(E, H, scale="E")


def sigmoid_weights(E, H):
    return Separate(E, H, weights="sigmoid")


def softmax_over_queries(E, H):
    return Separate(E, H, weights="queries")


class ConstantScale(Separate):
    """The scale written as a number, right only for 64-wide heads."""

    def __init__(self, d_model, n_heads):
        super().__init__(d_model, n_heads, scale=0.125)


class FusedQKV(nn.Module):
    """One nn.Linear(E, 3E); ``layout``: "3hd" (chunks q, k, v), "h3d" (per head
    interleaved), "vqk" (chunks in the order v, q, k), "flat" (the bug: the (B, T, 3E)
    output reshaped straight to (3, B, H, T, d))."""

    def __init__(self, embed_dim, num_heads, layout="3hd", causal=False):
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.qkv = nn.Linear(embed_dim, 3 * embed_dim)
        self.proj = nn.Linear(embed_dim, embed_dim)
        self.layout, self.causal = layout, causal

    def forward(self, x):
        B, T, E = x.shape
        qkv = self.qkv(x)
        if self.layout == "3hd":
            q, k, v = qkv.view(B, T, 3, self.H, self.d).permute(2, 0, 3, 1, 4)
        elif self.layout == "h3d":
            q, k, v = qkv.view(B, T, self.H, 3, self.d).permute(3, 0, 2, 1, 4)
        elif self.layout == "vqk":
            v, q, k = (t.view(B, T, self.H, self.d).transpose(1, 2) for t in qkv.split(E, -1))
        else:
            q, k, v = qkv.reshape(3, B, self.H, T, self.d)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        return self.proj(out.transpose(1, 2).reshape(B, T, E))


def fused_interleaved(E, H):
    return FusedQKV(E, H, layout="h3d")


def fused_vqk(E, H):
    return FusedQKV(E, H, layout="vqk")


def fused_flat_reshape(E, H):
    return FusedQKV(E, H, layout="flat")


def fused_causal(E, H):
    return FusedQKV(E, H, causal=True)


class GroupedQuery(nn.Module):
    """GQA: 4 query heads over 2 key/value heads, k/v projections E -> Hkv * d."""

    def __init__(self, dim, n_heads, n_kv_heads=2):
        super().__init__()
        self.n_heads, self.n_kv, self.head_dim = n_heads, n_kv_heads, dim // n_heads
        self.wq = nn.Linear(dim, n_heads * self.head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * self.head_dim, bias=False)
        self.wo = nn.Linear(n_heads * self.head_dim, dim, bias=False)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        w = torch.softmax(q @ k.transpose(2, 3) / math.sqrt(self.head_dim), dim=-1)
        return self.wo((w @ v).transpose(1, 2).reshape(B, T, -1))


class Cross(nn.Module):
    """forward(query, key, value): separate projections, cross-attention."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, query, key, value):
        B, Tq, E = query.shape
        q = self.q_proj(query).view(B, Tq, self.H, self.d).transpose(1, 2)
        k = self.k_proj(key).view(B, -1, self.H, self.d).transpose(1, 2)
        v = self.v_proj(value).view(B, -1, self.H, self.d).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, E))


class TorchWrapper(nn.Module):
    """A block around torch.nn.MultiheadAttention; ``transpose``: feed a batch_first=False
    layer (T, B, E) as it wants; False (the bug): (B, T, E) straight in."""

    def __init__(self, d_model, nhead, batch_first=True, transpose=True):
        super().__init__()
        self.attn = nn.MultiheadAttention(d_model, nhead, batch_first=batch_first)
        self.transpose = not batch_first and transpose

    def forward(self, x):
        if self.transpose:
            x = x.transpose(0, 1)
        out, _ = self.attn(x, x, x, need_weights=False)
        return out.transpose(0, 1) if self.transpose else out


def seq_first_wrapper(E, H):
    return TorchWrapper(E, H, batch_first=False)


def seq_first_not_transposed(E, H):
    return TorchWrapper(E, H, batch_first=False, transpose=False)


class Rotary(nn.Module):
    """Rotary position embeddings on q and k (cos/sin tables in buffers, applied by a
    function): correct, and not a structure the oracle reads."""

    def __init__(self, d_model, n_heads, max_len=64):
        super().__init__()
        self.H, self.d = n_heads, d_model // n_heads
        self.wq, self.wk, self.wv = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.wo = nn.Linear(d_model, d_model, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        ang = torch.outer(torch.arange(max_len).float(), inv)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def rotate(self, t):
        T = t.shape[-2]
        a, b = t[..., 0::2], t[..., 1::2]
        c, s = self.cos[:T], self.sin[:T]
        return torch.stack((a * c - b * s, a * s + b * c), -1).flatten(-2)

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, self.H, self.d).transpose(1, 2)
                   for p in (self.wq, self.wk, self.wv))
        q, k = self.rotate(q), self.rotate(k)
        w = (q @ k.transpose(-1, -2) / math.sqrt(self.d)).softmax(-1)
        return self.wo((w @ v).transpose(1, 2).reshape(B, T, E))


class QKNorm(nn.Module):
    """A LayerNorm on each head's q and k before the scores (as several recent models):
    correct, and not a structure the oracle reads."""

    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.H, self.d = num_attention_heads, hidden_size // num_attention_heads
        self.q_proj = nn.Linear(hidden_size, hidden_size)
        self.k_proj = nn.Linear(hidden_size, hidden_size)
        self.v_proj = nn.Linear(hidden_size, hidden_size)
        self.o_proj = nn.Linear(hidden_size, hidden_size)
        self.q_norm, self.k_norm = nn.LayerNorm(self.d), nn.LayerNorm(self.d)

    def forward(self, x):
        B, T, E = x.shape
        q = self.q_norm(self.q_proj(x).view(B, T, self.H, self.d)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(B, T, self.H, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.H, self.d).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, E))


class ListOfFour(nn.Module):
    """Four projections in an nn.ModuleList, zipped with (query, key, value), a dropout
    module on the weights and an optional mask (as a well-known annotated tutorial)."""

    def __init__(self, h, d_model, dropout=0.1):
        super().__init__()
        self.d_k, self.h = d_model // h, h
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(4)])
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, query, key, value, mask=None):
        n = query.size(0)
        query, key, value = [lin(x).view(n, -1, self.h, self.d_k).transpose(1, 2)
                             for lin, x in zip(self.linears, (query, key, value))]
        scores = query @ key.transpose(-2, -1) / math.sqrt(self.d_k)
        if mask is not None:
            scores = scores.masked_fill(mask.unsqueeze(1) == 0, torch.finfo(scores.dtype).min)
        p = self.dropout(scores.softmax(dim=-1))
        x = (p @ value).transpose(1, 2).contiguous().view(n, -1, self.h * self.d_k)
        return self.linears[-1](x)


class FoldedHeads(nn.Module):
    """Heads folded into the batch, (B, T, H*d) -> (B*H, T, d), with lazy projections and
    valid_lens (as a widely used textbook)."""

    def __init__(self, num_hiddens, num_heads, dropout=0.0, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.W_q = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_k = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_v = nn.LazyLinear(num_hiddens, bias=bias)
        self.W_o = nn.LazyLinear(num_hiddens, bias=bias)

    def fold(self, X):
        X = X.reshape(X.shape[0], X.shape[1], self.num_heads, -1).permute(0, 2, 1, 3)
        return X.reshape(-1, X.shape[2], X.shape[3])

    def forward(self, queries, keys, values, valid_lens=None):
        q, k = self.fold(self.W_q(queries)), self.fold(self.W_k(keys))
        v = self.fold(self.W_v(values))
        scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(q.shape[-1])
        if valid_lens is not None:
            lens = torch.repeat_interleave(valid_lens, self.num_heads, dim=0)
            keep = torch.arange(k.shape[1])[None, None, :] < lens[:, None, None]
            scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
        out = torch.bmm(scores.softmax(-1), v)
        out = out.reshape(-1, self.num_heads, out.shape[1], out.shape[2]).permute(0, 2, 1, 3)
        return self.W_o(out.reshape(out.shape[0], out.shape[1], -1))


class WithResidual(Separate):
    """The residual added inside the attention module: the output is not the output
    projection's."""

    def forward(self, x):
        return x + super().forward(x)


class QAndFusedKV(nn.Module):
    """A q projection and one E -> 2E projection for k and v."""

    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.H, self.d = num_heads, embed_dim // num_heads
        self.to_q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.to_kv = nn.Linear(embed_dim, 2 * embed_dim, bias=False)
        self.to_out = nn.Linear(embed_dim, embed_dim)

    def forward(self, x):
        B, T, E = x.shape
        k, v = self.to_kv(x).chunk(2, dim=-1)
        q, k, v = (t.reshape(B, T, self.H, self.d).transpose(1, 2) for t in (self.to_q(x), k, v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.to_out(out.transpose(1, 2).reshape(B, T, E))


class TwoHeadsNoAttribute(nn.Module):
    """Two heads fixed inside, and no attribute that says so (passed as an instance)."""

    def __init__(self, width=16):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = (p(x).view(B, T, 2, E // 2).transpose(1, 2) for p in (self.q, self.k, self.v))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.o(out.transpose(1, 2).reshape(B, T, E))


two_heads_instance = TwoHeadsNoAttribute()


class CausalCross(Cross):
    """forward(query, key, value) with a causal mask inside (a decoder's self-attention
    written with three inputs)."""

    def forward(self, query, key, value):
        B, Tq, E = query.shape
        q = self.q_proj(query).view(B, Tq, self.H, self.d).transpose(1, 2)
        k = self.k_proj(key).view(B, -1, self.H, self.d).transpose(1, 2)
        v = self.v_proj(value).view(B, -1, self.H, self.d).transpose(1, 2)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out_proj(out.transpose(1, 2).reshape(B, Tq, E))


class TimmStyle(nn.Module):
    """Fused qkv unbound from (3, B, H, N, d), q scaled before the product, nn.Identity
    where a q/k norm may go (as a well-known vision library)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_norm=False):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = nn.LayerNorm(self.head_dim) if qk_norm else nn.Identity()
        self.attn_drop = nn.Dropout(0.0)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(0.0)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = self.q_norm(q), self.k_norm(k)
        q = q * self.scale
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        x = (self.attn_drop(attn) @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj_drop(self.proj(x))


class BertStyleNoOutput(nn.Module):
    """Returns the merged heads (no output projection), and the weights."""
    def __init__(self, hidden_size, num_attention_heads):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.query = nn.Linear(hidden_size, hidden_size)
        self.key = nn.Linear(hidden_size, hidden_size)
        self.value = nn.Linear(hidden_size, hidden_size)

    def t(self, x):
        shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        q, k = self.t(self.query(hidden_states)), self.t(self.key(hidden_states))
        v = self.t(self.value(hidden_states))
        s = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            s = s + attention_mask
        p = nn.functional.softmax(s, dim=-1)
        ctx = torch.matmul(p, v).permute(0, 2, 1, 3).contiguous()
        return ctx.view(ctx.size()[:-2] + (hidden_states.shape[-1],)), p


class RawParams(nn.Module):
    """Projections as raw parameters (x @ W): correct, and not read by the oracle."""

    def __init__(self, d_model, n_heads):
        super().__init__()
        self.h = n_heads
        self.Wq, self.Wk, self.Wv, self.Wo = (
            nn.Parameter(torch.randn(d_model, d_model) / d_model ** 0.5) for _ in range(4))

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = ((x @ W).view(B, T, self.h, -1).transpose(1, 2)
                   for W in (self.Wq, self.Wk, self.Wv))
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return out.transpose(1, 2).reshape(B, T, E) @ self.Wo


class DropoutAlwaysOn(Separate):
    """Dropout on the output that eval() cannot reach (training=True written out)."""

    def forward(self, x):
        return nn.functional.dropout(super().forward(x), 0.1, training=True)


class LogSoftmaxWeights(Separate):
    """log_softmax where the softmax belongs: weights that are all negative."""

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        p = nn.functional.log_softmax(q @ k.transpose(-2, -1) / math.sqrt(self.d_k), dim=-1)
        return self.w_o((p @ v).transpose(1, 2).reshape(B, T, E))


class Additive(nn.Module):
    """Additive attention, w . tanh(W_q q + W_k k), as a module: correct, and not the
    dot-product attention the oracle compares."""

    def __init__(self, embed_dim, num_hiddens):
        super().__init__()
        self.W_q = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.W_k = nn.Linear(embed_dim, num_hiddens, bias=False)
        self.w_v = nn.Linear(num_hiddens, 1, bias=False)

    def forward(self, queries, keys, values):
        features = torch.tanh(self.W_q(queries)[:, :, None] + self.W_k(keys)[:, None])
        return self.w_v(features).squeeze(-1).softmax(-1) @ values


class MemoryKeys(Separate):
    """Two learned key/value slots per head joined to every sequence's keys: correct, and
    parameters the oracle does not read."""

    def __init__(self, d_model, num_heads):
        super().__init__(d_model, num_heads)
        self.mem_k = nn.Parameter(torch.randn(num_heads, 2, self.d_k))
        self.mem_v = nn.Parameter(torch.randn(num_heads, 2, self.d_k))

    def forward(self, x):
        B, T, E = x.shape
        q, k, v = self.split(self.w_q(x)), self.split(self.w_k(x)), self.split(self.w_v(x))
        k = torch.cat([self.mem_k.expand(B, -1, -1, -1), k], dim=2)
        v = torch.cat([self.mem_v.expand(B, -1, -1, -1), v], dim=2)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.w_o(out.transpose(1, 2).reshape(B, T, E))


class GroupedByRepeat(GroupedQuery):
    """GQA with repeat (query head h on key/value head h % Hkv): the same modules as
    repeat_interleave's, with the query heads in another order."""

    def forward(self, x):
        B, T, _ = x.shape
        q = self.wq(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(B, T, self.n_kv, self.head_dim).transpose(1, 2)
        rep = self.n_heads // self.n_kv
        k, v = k.repeat(1, rep, 1, 1), v.repeat(1, rep, 1, 1)
        out = nn.functional.scaled_dot_product_attention(q, k, v)
        return self.wo(out.transpose(1, 2).reshape(B, T, -1))
