"""Wrong examples and fixes of the codes the multi-head and model checks find."""

from __future__ import annotations

_HEAD = '''import torch
import torch.nn.functional as F
from torch import nn
from attnkit.check import check_multi_head


class MultiHead(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.h, self.d = num_heads, embed_dim // num_heads
'''
_PROJ = '''        self.proj = nn.ModuleList([nn.Linear(embed_dim, embed_dim) for _ in range(4)])
'''
_FORWARD = '''
    def forward(self, query, key, value):
        B, Tq, E = query.shape
        q, k, v = (self.split(p(x)) for p, x in zip(self.proj, (query, key, value)))
        w = torch.softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)
        return self.proj[3](self.merge(w @ v))

    def split(self, x):  # (B, T, E) -> (B, H, T, d)
        return x.view(x.shape[0], x.shape[1], self.h, self.d).transpose(1, 2)

    def merge(self, x):  # (B, H, T, d) -> (B, T, E)
        return x.transpose(1, 2).reshape(x.shape[0], x.shape[2], self.h * self.d)
'''


def _module(init: str, forward: str = _FORWARD, check: str = "") -> str:
    return _HEAD + init + forward + "\n\n" + check


_OK = "assert check_multi_head(MultiHead).ok\n"
_MODEL = '''import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
from attnkit.check import check_model
from attnkit.check.model.load import tiny_model


def my_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                 **kwargs):
'''

EXAMPLES: dict[str, tuple[str, str]] = {
    "unregistered-parameter": (
        _module('''        # a plain list: the module never sees these layers
        self.proj = [nn.Linear(embed_dim, embed_dim) for _ in range(4)]
''', check='assert "unregistered-parameter" in check_multi_head(MultiHead).codes\n'),
        _module(_PROJ, check=_OK)),
    "no-gradient": (
        _module(_PROJ + '''        self.gate = nn.Linear(embed_dim, embed_dim)  # never used
''', check='assert check_multi_head(MultiHead).codes == ["no-gradient"]\n'),
        _module(_PROJ, check=_OK)),
    "state-dict": (
        _module(_PROJ + '''        self.bias = torch.randn(embed_dim)  # plain: not saved
''', _FORWARD.replace("return self.proj[3](self.merge(w @ v))",
                      "return self.proj[3](self.merge(w @ v)) + self.bias"),
            'assert "state-dict" in check_multi_head(MultiHead).codes\n'),
        _module(_PROJ + '''        self.register_buffer("bias", torch.randn(embed_dim))  # saved
''', _FORWARD.replace("return self.proj[3](self.merge(w @ v))",
                      "return self.proj[3](self.merge(w @ v)) + self.bias"), _OK)),
    "dropout-in-eval": (
        _module(_PROJ, _FORWARD.replace(
            "w = torch.softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)",
            "w = torch.softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)\n"
            "        w = F.dropout(w, 0.1)  # training defaults to True: on after eval()"),
            'assert "dropout-in-eval" in check_multi_head(MultiHead).codes\n'),
        _module(_PROJ, _FORWARD.replace(
            "w = torch.softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)",
            "w = torch.softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)\n"
            "        w = F.dropout(w, 0.1, training=self.training)"), _OK)),
    "mixes-queries": (
        _module(_PROJ, _FORWARD.replace(
            "return x.view(x.shape[0], x.shape[1], self.h, self.d).transpose(1, 2)",
            "return x.view(x.shape[0], self.h, x.shape[1], self.d)  # no transpose"),
            'assert "mixes-queries" in check_multi_head(MultiHead).codes\n'),
        _module(_PROJ, check=_OK)),
    "mask-mismatch": (
        _MODEL + '''    Tq, Tk = query.shape[-2], key.shape[-2]
    causal = torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq)  # never sees the padding
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=causal, scale=scaling,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("mine", my_attention)  # no mask function: it gets no mask
report = check_model(tiny_model("llama"), implementations=["mine"], padding="left")
assert "mask-mismatch" in report.codes
''',
        _MODEL + '''    mask = attention_mask
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling,
                                         enable_gqa=key.shape[1] != query.shape[1])
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("mine", my_attention)
AttentionMaskInterface.register("mine", sdpa_mask)  # the padding and causal mask, as SDPA's
report = check_model(tiny_model("llama"), implementations=["mine"], padding="left")
assert report.ok, report.codes
'''),
    "padding-ignored": (
        _MODEL + '''    # is_causal builds its own mask: attention_mask and its padding are dropped
    gqa = key.shape[1] != query.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, is_causal=query.shape[-2] > 1,
                                         scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("mine", my_attention)
AttentionMaskInterface.register("mine", sdpa_mask)  # it receives the padding, and ignores it
report = check_model(tiny_model("llama"), implementations=["mine"], padding="left")
assert "padding-ignored" in report.codes
''',
        _MODEL + '''    gqa = key.shape[1] != query.shape[1]
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask,
                                         scale=scaling, enable_gqa=gqa)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register("mine", my_attention)
AttentionMaskInterface.register("mine", sdpa_mask)
report = check_model(tiny_model("llama"), implementations=["mine"], padding="left")
assert report.ok, report.codes
'''),
}
