"""Wrong examples and fixes of the codes the block check (``check_block``) finds."""

from __future__ import annotations

_HEAD = '''import torch
from torch import nn
from attnkit.check import check_block
from attnkit.torch import MultiHeadAttention


class Block(nn.Module):
    def __init__(self, dim, n_heads):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = MultiHeadAttention(dim, n_heads)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
'''
_PRE_NORM = '''        x = x + self.attn(self.norm1(x), causal=True)[0]
        return x + self.mlp(self.norm2(x))
'''
_OK = "\n\nreport = check_block(Block)\nassert report.ok, report.codes\n"


def _block(forward: str, check: str) -> str:
    return _HEAD + forward + "\n\n" + check


EXAMPLES: dict[str, tuple[str, str]] = {
    "post-norm": (
        _block('''        x = self.norm1(x + self.attn(x, causal=True)[0])  # the norm after the add
        return self.norm2(x + self.mlp(x))
''', 'assert check_block(Block).codes == ["post-norm"]\n'),
        _HEAD + _PRE_NORM + _OK),
    "residual": (
        _block('''        x = self.attn(self.norm1(x), causal=True)[0]  # replaces x, not added
        return x + self.mlp(self.norm2(x))
''', 'assert check_block(Block).codes == ["residual"]\n'),
        _HEAD + _PRE_NORM + _OK),
}
