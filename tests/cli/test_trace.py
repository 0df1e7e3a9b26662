"""attnkit.viz.trace: the shape trace watches multi_head_attention from outside.

The oracle (attnkit.numpy.multi_head_attention) has no trace parameter; trace_mha runs the
same named steps of attnkit.numpy.mha and must return the very numbers the oracle returns.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import attnkit.numpy as an
from attnkit.viz.trace import SHAPE_NAMES, trace_mha, trace_shapes


def draw_params(rng, H, Hkv, Eq, Ek, Ev, Dk, Dv, Eo, bias):
    P = {
        "w_q": rng.standard_normal((H, Eq, Dk)), "w_k": rng.standard_normal((Hkv, Ek, Dk)),
        "w_v": rng.standard_normal((Hkv, Ev, Dv)), "w_o": rng.standard_normal((H * Dv, Eo)),
    }
    if bias:
        P.update(b_q=rng.standard_normal((H, Dk)), b_k=rng.standard_normal((Hkv, Dk)),
                 b_v=rng.standard_normal((Hkv, Dv)), b_o=rng.standard_normal(Eo))
    return an.MultiHeadParams(**P)


def test_the_oracle_has_no_trace_parameter():
    assert "trace" not in inspect.signature(an.multi_head_attention).parameters


def test_trace_callback_gets_every_step():
    rng = np.random.default_rng(33)
    P = draw_params(rng, 4, 2, 8, 6, 5, 3, 2, 7, True)
    seen = []
    trace_mha(
        P, rng.standard_normal((2, 3, 8)), rng.standard_normal((2, 4, 6)),
        rng.standard_normal((2, 4, 5)), report=lambda step, shape: seen.append((step, shape)),
    )
    assert seen == [
        ("query", (2, 3, 8)), ("W_q", (4, 8, 3)), ("W_k", (2, 6, 3)), ("W_v", (2, 5, 2)),
        ("W_o", (8, 7)), ("q", (2, 4, 3, 3)), ("k", (2, 2, 4, 3)), ("v", (2, 2, 4, 2)),
        ("scores", (2, 4, 3, 4)), ("weights", (2, 4, 3, 4)), ("head outputs", (2, 4, 3, 2)),
        ("concat", (2, 3, 8)), ("output", (2, 3, 7)),
    ]
    assert [step for step, _ in seen] == list(SHAPE_NAMES)  # every step has its symbol


def test_trace_prints_seed001_lines_by_default(capsys):
    P = an.MultiHeadParams.init(6, 2, rng=np.random.default_rng(0))
    trace_mha(P, np.ones((1, 4, 6)))
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "query.shape=(1, 4, 6)" and printed[-1] == "output.shape=(1, 4, 6)"
    assert len(printed) == 13


def test_seed001_shape_lines(capsys):
    """Seed 001's verbose mode on its own input (moved here from tests/numpy/test_smoke.py
    when the oracle lost its trace parameter)."""
    np.random.seed(114514)
    x = np.random.randn(3, 11, 35)
    w_q, w_k, w_v = (np.random.randn(5, 35, 7) for _ in range(3))
    w_o = np.random.randn(35, 35)
    params = an.MultiHeadParams(w_q, w_k, w_v, w_o, b_o=np.zeros(35))
    out, weights = trace_mha(params, x)
    printed = capsys.readouterr().out
    assert "q.shape=(3, 5, 11, 7)" in printed and "weights.shape=(3, 5, 11, 11)" in printed
    ref_out, ref_w = an.multi_head_attention(params, x)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(weights, ref_w)


CASES = {
    "self": ((3, 3, 6, 6, 6, 2, 2, 6, False), {}),
    "cross-gqa-bias": ((4, 2, 8, 6, 5, 3, 2, 7, True), {"causal": True}),
    "mqa-window-mask": ((4, 1, 5, 5, 5, 3, 4, 5, True),
                        {"window": (1, 0), "mask": np.array([True, False, True, True])}),
    "valid_lens-bias-scale": ((2, 2, 4, 4, 4, 3, 3, 4, False),
                              {"valid_lens": np.array([2, 4]), "bias": np.full((3, 4), 0.5),
                               "scale": 0.3}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_trace_returns_exactly_what_the_oracle_returns(name):
    """The trace and the oracle call the same steps: bit-identical results."""
    sizes, options = CASES[name]
    rng = np.random.default_rng(7)
    P = draw_params(rng, *sizes)
    Eq, Ek, Ev = sizes[2:5]
    query = rng.standard_normal((2, 3, Eq))
    key, value = rng.standard_normal((2, 4, Ek)), rng.standard_normal((2, 4, Ev))
    if name == "self":
        key = value = None
    out, weights = trace_mha(P, query, key, value, report=lambda *_: None, **options)
    ref_out, ref_w = an.multi_head_attention(P, query, key, value, **options)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(weights, ref_w)


def test_trace_with_dropout_matches_the_oracle_on_the_same_seed():
    P = an.MultiHeadParams.init(8, 2, rng=np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 5, 8))
    out, _ = trace_mha(P, x, report=lambda *_: None, dropout_p=0.5,
                       rng=np.random.default_rng(3))
    ref, _ = an.multi_head_attention(P, x, dropout_p=0.5, rng=np.random.default_rng(3))
    np.testing.assert_array_equal(out, ref)
    no_drop, _ = an.multi_head_attention(P, x)
    assert not np.allclose(out, no_drop)  # dropout did act


def test_the_trace_says_which_query_heads_share_a_key_value_head_and_defines_ek():
    lines = []
    trace_shapes(embed_dim=36, num_heads=6, num_kv_heads=2, head_dim=5, kv_seq=4,
                 say=lines.append)
    gqa = [line for line in lines if "GQA" in line]
    assert len(gqa) == 1 and "query heads 0-2 read kv head 0, 3-5 read kv head 1" in gqa[0]
    assert lines.index(gqa[0]) + 1 == next(i for i, s in enumerate(lines) if "scores" in s)
    assert "Ek, Ev: widths of the key and value inputs (the memory, 36 here)" in lines[-1]
    mqa = []
    trace_shapes(num_heads=5, num_kv_heads=1, say=mqa.append)
    assert any("all 5 query heads read the one key/value head" in s for s in mqa)
    plain = []
    trace_shapes(say=plain.append)
    assert not any("GQA" in s or "MQA" in s for s in plain)
