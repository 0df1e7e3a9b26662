"""A NaN/inf in an attended position reaches the gradients where the definition puts it, in
flash_attention's backward and in the oracle's (scaled_dot_product_attention's) alike:
the same entries of dQ, dK and dV are non-finite as in
:func:`attnkit.testing.reference_attention`, which takes each row's softmax and sums over
its allowed keys only (DESIGN.md, "Non-finite values and empty rows", points 3 and 4: the
NumPy oracle keeps exact semantics, masked entries are selected away).

A row that attended a NaN has a NaN row term ``D = rowsum(P * dP)``, and a NaN score makes
its log-sum-exp NaN. Neither may reach the row's masked keys through ``0 * nan``
(``P * (dP - D)`` with ``P = 0``, or ``exp(-inf - nan)``): those keys' dK and dV get
nothing from the row, whatever the tile sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

from attnkit.numpy import flash_attention, scaled_dot_product_attention, vjp
from attnkit.testing import reference_attention

pytestmark = pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")

B, H, T, D = 1, 2, 7, 4
BANDS = {
    "window(1,1)": {"window": (1, 1)},
    "window(2,0)": {"window": (2, 0)},
    "causal": {"causal": True},
    "full": {},
}
# (tensor, index into (B, H, T, D), value)
POISON = {
    "nan-v5": ("v", (0, 0, 5, slice(None)), np.nan),
    "nan-v0-one-feature": ("v", (0, 1, 0, 2), np.nan),
    "inf-v3": ("v", (0, 0, 3, 1), np.inf),
    "nan-k4": ("k", (0, 0, 4, 0), np.nan),
    "nan-q6": ("q", (0, 1, 6, 3), np.nan),
}


def _inputs(poison: tuple) -> tuple[dict[str, np.ndarray], np.ndarray]:
    rng = np.random.default_rng(7)
    x = {n: rng.standard_normal((B, H, T, D)).astype(np.float32) for n in "qkv"}
    name, where, value = poison
    x[name][where] = value
    return x, rng.standard_normal((B, H, T, D)).astype(np.float32)


def _reference(x: dict[str, np.ndarray], d_out: np.ndarray, band: dict) -> list[np.ndarray]:
    ref = reference_attention(*(x[n].astype(np.float64) for n in "qkv"),
                              d_out=d_out.astype(np.float64), **band)
    return [ref.dq, ref.dk, ref.dv]


def _assert_same_pattern(got: list, want: list, value: float) -> None:
    # NaN where the definition has NaN; with an inf, whether a sum of infs is +-inf or NaN
    # depends on the order of the sum, so there the non-finite entries are compared.
    bad = np.isnan if np.isnan(value) else (lambda g: ~np.isfinite(g))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        g, w = bad(g), bad(w)
        assert w.any() or name == "dv", f"{name}: the case should reach the gradient"
        np.testing.assert_array_equal(
            g, w, err_msg=f"{name}: non-finite at {np.argwhere(g).tolist()[:6]}... "
            f"({g.sum()} entries), the definition at {np.argwhere(w).tolist()[:6]}... "
            f"({w.sum()} entries)")


@pytest.mark.parametrize("blocks", [(64, 64), (2, 2), (3, 1)], ids=lambda b: f"{b[0]}x{b[1]}")
@pytest.mark.parametrize("poison", list(POISON.values()), ids=list(POISON))
@pytest.mark.parametrize("band", list(BANDS.values()), ids=list(BANDS))
def test_flash_backward_nan_pattern_is_the_definitions(band, poison, blocks):
    x, d_out = _inputs(poison)
    _, pull = vjp(flash_attention, x["q"], x["k"], x["v"], block_q=blocks[0],
                  block_k=blocks[1], **band)
    _assert_same_pattern(list(pull(d_out)), _reference(x, d_out, band), poison[2])


@pytest.mark.parametrize("poison", list(POISON.values()), ids=list(POISON))
@pytest.mark.parametrize("band", list(BANDS.values()), ids=list(BANDS))
def test_oracle_backward_nan_pattern_is_the_definitions(band, poison):
    x, d_out = _inputs(poison)
    _, pull = vjp(scaled_dot_product_attention, *(x[n].astype(np.float64) for n in "qkv"),
                  **band)
    got = list(pull(d_out.astype(np.float64)))
    _assert_same_pattern(got, _reference(x, d_out, band), poison[2])


def test_the_audit_case_flash_and_oracle_agree():
    """Window (1, 1), T = 7, float32, NaN in v[0, 0, 5, :]: rows 4..6 attend key 5, so dQ
    is NaN in those rows and dK at the keys they attend (3..6, 16 entries), in flash, in
    the float64 oracle and in the definition; the oracle used to put NaN at all 7 keys
    (28 entries) through 0 * nan at the masked ones."""
    x, d_out = _inputs(POISON["nan-v5"])
    band = {"window": (1, 1)}
    _, flash_pull = vjp(flash_attention, x["q"], x["k"], x["v"], **band)
    _, oracle_pull = vjp(scaled_dot_product_attention,
                         *(x[n].astype(np.float64) for n in "qkv"), **band)
    for grads in (flash_pull(d_out), oracle_pull(d_out.astype(np.float64)),
                  _reference(x, d_out, band)):
        dq, dk, dv = (np.isnan(g) for g in grads)
        assert dq[0, 0].any(-1).tolist() == [False] * 4 + [True] * 3
        assert dk[0, 0].all(-1).tolist() == [False] * 3 + [True] * 4 and dk.sum() == 16
        assert not dv.any()


def test_oracle_weights_are_0_at_masked_keys_of_a_nan_row():
    """DESIGN point 2 in the oracle: a row with a NaN score has NaN weights at its allowed
    keys and exactly 0 at its masked ones (0 / nan was NaN)."""
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 5, 3)) for _ in range(3))
    k[0, 1, 0] = np.nan  # attended (causal) by queries 1..4
    _, w = scaled_dot_product_attention(q, k, v, causal=True)
    allowed = np.tril(np.ones((5, 5), dtype=bool))
    assert (w[0][~allowed] == 0).all()
    assert np.isnan(w[0, 1:][allowed[1:]]).all() and np.isfinite(w[0, 0]).all()


@pytest.mark.parametrize("poison", ["k", "v"])
def test_gqa_nan_pattern_is_the_definitions(poison):
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, 4, 9, 3)).astype(np.float32)  # B=2, H=4
    k, v = (rng.standard_normal((2, 2, 9, 3)).astype(np.float32) for _ in range(2))  # Hkv=2
    (k if poison == "k" else v)[0, 1, 6, 0] = np.nan
    d_out = rng.standard_normal(q.shape).astype(np.float32)
    band = {"window": (1, 0)}
    _, pull = vjp(flash_attention, q, k, v, block_q=2, block_k=2, **band)
    want = reference_attention(*(x.astype(np.float64) for x in (q, k, v)),
                               d_out=d_out.astype(np.float64), **band)
    _assert_same_pattern(list(pull(d_out)), [want.dq, want.dk, want.dv], np.nan)
