"""Seed 001 and seed 003 reproduce (the two acceptance examples of the reference)."""

from __future__ import annotations

import numpy as np

import attnkit.numpy as an

SEED001_OUT = np.array([
    -1.00275258, -25.66227608, 42.57650594, 7.97341477, -2.09239899,
    22.53574569, -32.31421119, -19.31954746, 35.94738272, 5.09795971,
    -34.47604002, 0.86513501, 50.51554347, 21.8124433, 35.35536458,
    -30.79651531, 0.38839876, 6.82163086, -14.5239423, -50.32858852,
    20.92636831, -11.40505511, 34.35585814, -8.64440007, 17.03970826,
    -46.23846407, 0.86446847, 27.91816735, -6.19561116, -11.2085796,
    -0.52242257, -86.61101946, -23.54598171, -26.04331552, -26.03110728,
])
SEED001_W = np.array([
    1.29420131e-12, 1.81028363e-33, 4.99676145e-31, 5.48498138e-21,
    3.03060036e-26, 1.09915871e-16, 3.71961110e-10, 1.56721677e-26,
    1.97962592e-25, 1.00000000e+00, 2.35854129e-25,
])


def test_seed001_multi_head_attention_reproduces():
    np.random.seed(114514)
    x = np.random.randn(3, 11, 35)
    w_q, w_k, w_v = (np.random.randn(5, 35, 7) for _ in range(3))
    w_o = np.random.randn(35, 35)
    params = an.MultiHeadParams(w_q, w_k, w_v, w_o, b_o=np.zeros(35))
    out, weights = an.multi_head_attention(params, x)
    np.testing.assert_allclose(out[0, 0], SEED001_OUT, rtol=1e-6)
    np.testing.assert_allclose(weights[0, 0, 0], SEED001_W, rtol=1e-6)
    # seed 001's verbose shape lines: tests/cli/test_trace.py (attnkit.viz.trace).


def test_seed003_d2l_valid_lens_example():
    keys = np.ones((2, 10, 2))
    values = np.tile(np.arange(40.0).reshape(1, 10, 4), (2, 1, 1))
    queries = np.random.default_rng(0).standard_normal((2, 1, 2))
    out, weights = an.scaled_dot_product_attention(
        queries, keys, values, valid_lens=np.array([2, 6])
    )
    np.testing.assert_allclose(out, [[[2, 3, 4, 5]], [[10, 11, 12, 13]]], rtol=1e-12)
    assert np.all(weights[0, :, 2:] == 0) and np.all(weights[1, :, 6:] == 0)
