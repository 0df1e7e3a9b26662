"""check_block: a pre-norm Transformer block judged by behaviour, whatever it is made of."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from attnkit.check import check_block  # noqa: E402
from attnkit.torch import MultiHeadAttention  # noqa: E402


class RMSNorm(nn.Module):
    """A norm of the user's own (Llama's): found by its class name, kept when zeroing."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class LlamaStyle(nn.Module):
    """Pre-norm with RMSNorm, a bias-free SwiGLU MLP, and (out, weights) returned."""

    def __init__(self, dim, n_heads):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.attn = MultiHeadAttention(dim, n_heads, bias=False)
        self.gate = nn.Linear(dim, 2 * dim, bias=False)
        self.up = nn.Linear(dim, 2 * dim, bias=False)
        self.down = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        a, w = self.attn(self.norm1(x), causal=True, need_weights=True)
        x = x + a
        h = self.norm2(x)
        return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h)), w


class NoNorms(LlamaStyle):
    """x + attn(x), x + mlp(x): the residual adds are right, the norms missing."""

    def forward(self, x):
        x = x + self.attn(x, causal=True)[0]
        return x + self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class Shrinks(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.proj = nn.Linear(embed_dim, embed_dim // 2)

    def forward(self, x):
        return self.proj(x)


def test_a_llama_style_block_passes():
    report = check_block(LlamaStyle)
    assert report.ok and report.codes == [], report
    assert report.causality.startswith("behaves as causal")


def test_a_block_without_norms_is_named_residual():
    report = check_block(NoNorms)
    assert report.codes == ["residual"], report
    assert "without its norm" in report.findings[0].message


def test_a_bidirectional_block_passes_when_not_declared_causal():
    class Encoder(LlamaStyle):
        def forward(self, x):
            x = x + self.attn(self.norm1(x))[0]
            h = self.norm2(x)
            return x + self.down(nn.functional.silu(self.gate(h)) * self.up(h))

    assert check_block(Encoder).codes == ["causal-leak"]
    report = check_block(Encoder, causal=False)
    assert report.ok and report.causality.startswith("bidirectional"), report


def test_wrong_shape_and_a_raising_constructor_are_findings_not_tracebacks():
    assert check_block(Shrinks).codes == ["shape"]

    def broken(embed_dim, num_heads):
        raise RuntimeError("no block today")

    report = check_block(broken)
    assert report.codes == ["call-failed"] and "no block today" in report.findings[0].message


def test_a_post_norm_block_with_rmsnorm_is_named_as_a_module_error_in_chinese_too():
    # RMSNorm leaves rows of mean square 1, not mean 0 (it was called residual). A block
    # takes the multi-head severities of the catalogue; and each sentence of its
    # report is a catalogue template (the conftest reads every report in Chinese too).
    class PostNorm(LlamaStyle):
        def forward(self, x):
            x = self.norm1(x + self.attn(x, causal=True)[0])
            return self.norm2(x + self.down(nn.functional.silu(self.gate(x)) * self.up(x)))

    report = check_block(PostNorm)
    assert report.codes == ["post-norm"], report
    finding = report.findings[0]
    assert finding.kind == "multi-head" and finding.is_error and not report.ok
    zh = report.text(lang="zh")
    assert "后置层规范化" in zh and "post-norm" in zh, zh
