"""attnkit's own backends pass every check (no error finding), with the convention named;
so do plain PyTorch SDPA and, but for its NaN on a fully masked row, nn.MultiheadAttention."""

from __future__ import annotations

import importlib.util

import pytest

torch = pytest.importorskip("torch")

import attnkit.numpy as anp  # noqa: E402
import attnkit.torch as at  # noqa: E402
from attnkit.check import (  # noqa: E402
    check_attention,
    check_masked_softmax,
    check_multi_head,
    check_softmax,
)


def numpy_keep(q, k, v, mask=None):
    return anp.scaled_dot_product_attention(q, k, v, mask=mask)


def numpy_valid_lens(q, k, v, valid_lens=None):
    return anp.scaled_dot_product_attention(q, k, v, valid_lens=valid_lens)


def _torch_path(backend):
    def attention(q, k, v, mask=None):
        return at.attention(q, k, v, mask=mask, backend=backend)

    attention.__qualname__ = f"attention_{backend}"
    return attention


def _torch_sdpa_convention(backend):
    def attention(q, k, v, attn_mask=None, is_causal=False):
        causal = "top_left" if is_causal else False  # SDPA's own alignment, named
        return at.attention(q, k, v, mask=attn_mask, causal=causal, backend=backend)

    return attention


@pytest.mark.parametrize("fn, convention", [
    (numpy_keep, "keep"), (numpy_valid_lens, "valid_lens"), (numpy_keep, "auto"),
], ids=["numpy-keep", "numpy-valid_lens", "numpy-auto"])
def test_numpy_attention_passes(fn, convention):
    report = check_attention(fn, convention=convention)
    assert report.framework == "numpy" and report.findings == [], report.table()
    assert report.convention.startswith("valid_lens" if fn is numpy_valid_lens else "keep")


@pytest.mark.parametrize("backend", ["sdpa", "math", "auto"])
def test_torch_attention_passes_on_every_path(backend):
    report = check_attention(_torch_path(backend), convention="keep")
    assert report.framework == "torch" and report.findings == [], report.table()
    assert any("bfloat16" in case for case in report.cases)


def test_torch_attention_with_sdpa_causal_is_named_top_left():
    report = check_attention(_torch_sdpa_convention("auto"), convention="sdpa")
    assert report.ok and report.codes == ["causal-alignment"], report.table()


def test_plain_sdpa_passes_with_its_convention_named():
    report = check_attention(torch.nn.functional.scaled_dot_product_attention,
                             convention="sdpa")
    assert report.ok, report.table()
    assert report.codes == ["causal-alignment"]  # top-left is_causal: a warning, named
    assert report.convention == "sdpa (declared)"


def test_softmaxes_pass():
    for fn in (anp.softmax, at.safe_softmax):
        assert check_softmax(fn).findings == []
    for fn in (anp.masked_softmax, at.masked_softmax):
        report = check_masked_softmax(fn)
        assert report.findings == [] and report.convention.startswith("valid_lens")


def test_torch_modules_pass():
    dot = check_attention(at.DotProductAttention(0.0))
    assert dot.findings == [] and dot.convention.startswith("valid_lens"), dot.table()
    assert dot.layout == "(B, T, D)"
    mha = check_multi_head(at.MultiHeadAttention)
    assert mha.findings == [] and mha.convention.startswith("valid_lens"), mha.table()
    compat = check_multi_head(lambda E, H: at.MultiheadAttention(E, H, dropout=0.1),
                              convention="masked")
    assert compat.findings == [] and compat.layout.startswith("(T, B, E)"), compat.table()
    gqa = check_multi_head(lambda E, H: at.MultiHeadAttention(E, H, num_kv_heads=2,
                                                              dropout=0.1))
    assert gqa.findings == [], gqa.table()


def test_nn_multihead_attention_passes_but_for_nan_on_a_fully_masked_row():
    """torch.nn.MultiheadAttention (torch 2.13) returns NaN for a query whose every key is
    masked; everything else passes. attnkit.torch.MultiheadAttention, its drop-in, passes."""
    report = check_multi_head(lambda E, H: torch.nn.MultiheadAttention(E, H, batch_first=True),
                              convention="masked")
    assert report.codes == ["nan-or-inf"], report.table()
    assert "no allowed key" in report.findings[0].message


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")
def test_triton_kernel_passes_under_the_interpreter():
    from attnkit.triton import flash_attention

    def triton_attention(q, k, v):
        # The kernel takes float16/bfloat16/float32; the interpreter (NumPy on the CPU) has
        # no faithful half-precision arithmetic (tests/triton runs half precision on a GPU
        # only), so here the kernel runs in float32 and the result is cast back.
        if q.dtype != torch.float32:
            out = flash_attention(q.float(), k.float(), v.float())
            return (out[0] if isinstance(out, tuple) else out).to(q.dtype)
        return flash_attention(q, k, v)

    report = check_attention(triton_attention)
    assert report.findings == [], report.table()
