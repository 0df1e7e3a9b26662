"""attnkit.triton.flash_attention against the float64 references (DESIGN.md 2x/3x/5x rule).

Each case runs forward and backward once (loss = <out, dO> + <lse, dLSE>, so the LSE's own
gradient is exercised too) and judges out, lse, dq, dk, dv. On the CPU the kernels run in
the Triton interpreter at small sizes in float32 and float16; on a GPU the same cases run
at larger sizes in float16 and bfloat16.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import attnkit.numpy as an
from attnkit.testing import as_float64, assert_close_by_rule

ON_GPU = torch.cuda.is_available()
DEVICE = "cuda" if ON_GPU else "cpu"

# Sizes chosen to break kernels: lengths off the 16-wide interpreter tiles (17, 33, 70),
# Tq != Tk both ways, non-power-of-two head dims (40, 80), GQA and MQA.
if ON_GPU:
    T_SHORT, T_LONG, D_ODD, D_MAIN = 97, 1025, 80, 128
    DTYPES = [torch.float16, torch.bfloat16]
else:
    T_SHORT, T_LONG, D_ODD, D_MAIN = 17, 70, 40, 32
    # bfloat16 is left to the GPU run: NumPy has no bfloat16 and the interpreter's dot on
    # it returns garbage (seen: |out| ~ 8e8 for unit inputs), which says nothing about
    # the kernel.
    DTYPES = [torch.float32]

T_MID = 33 if not ON_GPU else 257

CASES = {
    "plain": dict(Tq=T_SHORT, Tk=T_SHORT),
    "odd_dim_tq_lt_tk": dict(Tq=T_MID, Tk=T_LONG, Dk=D_ODD),
    "causal_tq_lt_tk": dict(Tq=T_MID, Tk=T_LONG, causal=True, Dk=D_ODD),
    "causal_tq_gt_tk": dict(Tq=T_LONG, Tk=T_MID, causal=True),  # rows with no key
    "causal_square": dict(Tq=T_LONG, Tk=T_LONG, causal=True, Dk=D_MAIN),
    "window_both": dict(Tq=T_LONG, Tk=T_LONG, window=(9, 4)),
    "window_left_causal": dict(Tq=T_MID, Tk=T_LONG, causal=True, window=(20, None)),
    "window_right_only": dict(Tq=T_LONG, Tk=T_MID, window=(None, 3)),
    "gqa": dict(H=4, Hkv=2, Tq=T_MID, Tk=T_MID, causal=True),
    "mqa": dict(H=4, Hkv=1, Tq=T_SHORT, Tk=T_MID),
    "softcap": dict(Tq=T_MID, Tk=T_MID, causal=True, softcap=2.0, scale=0.5),
    "alibi_h": dict(Tq=T_SHORT, Tk=T_MID, causal=True, alibi="h"),
    "alibi_bh_softcap_window": dict(B=2, Tq=T_MID, Tk=T_MID, alibi="bh", softcap=5.0,
                                    window=(12, 2)),
    "dk_ne_dv": dict(Tq=T_SHORT, Tk=T_MID, Dk=D_MAIN, Dv=D_ODD),
    "dim_7": dict(Tq=T_SHORT, Tk=T_MID, Dk=7, causal=True),
    "dim_59_window": dict(Tq=T_MID, Tk=T_LONG, Dk=59, window=(30, 5)),
    "dim_111_gqa": dict(H=4, Hkv=2, Tq=T_SHORT, Tk=T_MID, Dk=111, causal=True),
    "dim_256": dict(Tq=T_SHORT, Tk=T_MID, Dk=256, causal=True),
    "len_97_causal": dict(Tq=97, Tk=97, causal=True),
    "one_query": dict(Tq=1, Tk=T_LONG, causal=True),
    "one_key": dict(Tq=T_SHORT, Tk=1),
}


def _run(fn, q, k, v, slopes, dout, dlse, options):
    """Forward + backward through ``fn``; returns out, lse, dq, dk, dv."""
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, lse = fn(q, k, v, slopes, options)
    finite = torch.isfinite(lse)
    loss = (out.to(dout.dtype) * dout).sum() + (torch.where(finite, lse, 0.0) * dlse.to(
        lse.dtype)).sum()
    loss.backward()
    return out.detach(), lse.detach(), q.grad, k.grad, v.grad


def _kernel(q, k, v, slopes, options):
    import attnkit.triton as at

    return at.flash_attention(q, k, v, **{**options, "alibi_slopes": slopes}, return_lse=True)


def _plain(q, k, v, slopes, options, reference):
    return reference.baseline(q, k, v, **{**options, "alibi_slopes": slopes})


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("params", list(CASES.values()), ids=list(CASES))
def test_forward_and_backward_follow_the_rule(params, dtype, case_type, inputs, reference):
    case = case_type(**params)
    q, k, v, slopes, dout, dlse = inputs(case, dtype)
    opts = case.options(None)
    got = _run(_kernel, q, k, v, slopes, dout, dlse, opts)

    def plain(*a):
        return _plain(*a, reference)

    base = _run(plain, q, k, v, slopes, dout, dlse, opts)
    r = reference.float64(q, k, v, dout=dout, dlse=dlse, **case.options(slopes))
    ref = (r.out, r.lse, r.dq, r.dk, r.dv)
    for name, a, r, b, factor in zip(["out", "lse", "dq", "dk", "dv"], got, ref, base,
                                     [2, 2, 5, 3, 3]):
        assert a.dtype == (torch.float32 if name == "lse" else dtype)
        assert_close_by_rule(a, r, b, factor=factor, name=name)


@pytest.mark.parametrize("params", [CASES[n] for n in ("causal_tq_lt_tk", "window_both",
                                                          "gqa", "causal_tq_gt_tk")],
                         ids=["causal_tq_lt_tk", "window_both", "gqa", "causal_tq_gt_tk"])
def test_float64_reference_matches_numpy_oracle(params, case_type, inputs, reference):
    """The float64 reference the rule uses agrees with attnkit.numpy (out and LSE)."""
    case = case_type(**params)
    q, k, v, _, _, _ = inputs(case, torch.float64)
    out, _, lse, *_ = reference.float64(q, k, v, causal=case.causal, window=case.window)
    qn, kn, vn = (as_float64(x) for x in (q, k, v))
    out_np, _ = an.scaled_dot_product_attention(qn, kn, vn, causal=case.causal,
                                                window=case.window)
    _, lse_np = an.flash_attention(qn, kn, vn, causal=case.causal, window=case.window,
                                   return_lse=True)
    np.testing.assert_allclose(as_float64(out), out_np, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(as_float64(lse)), np.isinf(lse_np))
    fin = np.isfinite(lse_np)
    np.testing.assert_allclose(as_float64(lse)[fin], lse_np[fin], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("params", [CASES[n] for n in ("causal_tq_lt_tk", "window_both",
                                                          "mqa")],
                         ids=["causal_tq_lt_tk", "window_both", "mqa"])
def test_forward_against_numpy_oracle_directly(params, case_type, inputs, at):
    """Out and LSE of the kernel against attnkit.numpy in float64, without the torch ref."""
    case = case_type(**params)
    dtype = DTYPES[0]
    q, k, v, _, _, _ = inputs(case, dtype)
    out, lse = at.flash_attention_forward(q, k, v, causal=case.causal, window=case.window)
    qn, kn, vn = (as_float64(x) for x in (q, k, v))
    out_np, _ = an.scaled_dot_product_attention(qn, kn, vn, causal=case.causal,
                                                window=case.window)
    _, lse_np = an.flash_attention(qn, kn, vn, causal=case.causal, window=case.window,
                                   return_lse=True)
    tol = 2e-6 if dtype == torch.float32 else 2e-2
    np.testing.assert_allclose(as_float64(out), out_np, atol=tol, rtol=tol)
    fin = np.isfinite(lse_np)
    assert np.array_equal(np.isfinite(as_float64(lse)), fin)
    np.testing.assert_allclose(as_float64(lse)[fin], lse_np[fin], atol=tol, rtol=tol)


@pytest.mark.skipif(ON_GPU, reason="float16 is covered by the main GPU parametrization")
def test_float16_in_the_interpreter(case_type, inputs, reference):
    """Half precision through the interpreter (NumPy has float16), one masked GQA case."""
    test_forward_and_backward_follow_the_rule(
        dict(H=4, Hkv=2, Tq=T_MID, Tk=T_LONG, Dk=D_ODD, causal=True, window=(25, None)),
        torch.float16, case_type, inputs, reference)


@pytest.mark.parametrize(
    "params",
    [dict(Tq=T_MID, Tk=T_MID, window=(None, -5)),  # rows 0..4: no key at or left of i - 5
     dict(Tq=T_LONG, Tk=T_SHORT, causal=True),  # the first Tq - Tk rows see nothing
     # Band [i - 8, i - 4] (diag = i + Tk - Tq): rows 0..3 have nothing to their left.
     dict(Tq=T_SHORT, Tk=T_MID, window=(T_MID - T_SHORT + 8, T_SHORT - T_MID - 4), alibi="h"),
     ],
    ids=["negative_right_window", "causal_tq_gt_tk", "band_off_the_left_edge"],
)
def test_fully_masked_rows_give_zero_output_minus_inf_lse_and_zero_grads(
        params, case_type, inputs, reference, at):
    case = case_type(**params)
    dtype = DTYPES[0]
    q, k, v, slopes, dout, _ = inputs(case, dtype)
    q, k, v = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out, lse = at.flash_attention(q, k, v, **case.options(slopes), return_lse=True)
    out.backward(dout)
    keep = reference.keep(case.Tq, case.Tk, case.causal, case.window, q.device)
    empty = ~keep.any(-1)
    assert empty.any() and not empty.all(), "case must mix empty and non-empty rows"
    assert torch.all(out[:, :, empty] == 0)
    assert torch.all(lse[:, :, empty] == float("-inf"))
    assert torch.all(torch.isfinite(lse[:, :, ~empty]))
    assert torch.all(q.grad[:, :, empty] == 0)
    for t in (out, lse[:, :, ~empty], q.grad, k.grad, v.grad):
        assert not torch.isnan(t).any()
    # Keys no query can see get zero dK and dV.
    unseen = ~keep.any(0)
    if unseen.any():
        assert torch.all(k.grad[:, :, unseen] == 0) and torch.all(v.grad[:, :, unseen] == 0)


def test_empty_key_sequence(at):
    q = torch.randn(1, 2, 5, 32, device=DEVICE, dtype=DTYPES[0])
    k = torch.randn(1, 2, 0, 32, device=DEVICE, dtype=DTYPES[0])
    out, lse = at.flash_attention_forward(q, k, k)
    assert torch.all(out == 0) and torch.all(lse == float("-inf"))


def test_gqa_equals_expanded_kv(case_type, inputs, at):
    """Sharing K/V across a group equals repeating them; dK/dV are the group sums."""
    case = case_type(H=4, Hkv=2, Tq=T_SHORT, Tk=T_MID, Dk=D_ODD, causal=True)
    q, k, v, _, dout, _ = inputs(case, DTYPES[0])
    qa, ka, va = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out = at.flash_attention(qa, ka, va, causal=True)
    out.backward(dout)
    ke, ve = (x.detach().repeat_interleave(2, dim=1).requires_grad_(True) for x in (k, v))
    qe = q.detach().clone().requires_grad_(True)
    out_e = at.flash_attention(qe, ke, ve, causal=True)
    out_e.backward(dout)
    tol = dict(atol=1e-6, rtol=1e-5) if DTYPES[0] == torch.float32 else dict(atol=1e-2,
                                                                             rtol=1e-2)
    torch.testing.assert_close(out, out_e, **tol)
    torch.testing.assert_close(qa.grad, qe.grad, **tol)
    torch.testing.assert_close(ka.grad, ke.grad.unflatten(1, (2, 2)).sum(2), **tol)
    torch.testing.assert_close(va.grad, ve.grad.unflatten(1, (2, 2)).sum(2), **tol)


def test_non_contiguous_inputs_and_caller_tensors_unchanged(case_type, inputs, reference,
                                                           at):
    """(B, T, H, D) views transposed to (B, H, T, D) work; nothing writes into them."""
    dtype = DTYPES[0]
    case = case_type(B=2, H=2, Tq=T_SHORT, Tk=T_MID, causal=True)
    q, k, v, _, dout, _ = inputs(case, dtype)
    qs, ks, vs = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v))
    assert not qs.is_contiguous()
    saved = [x.clone() for x in (qs, ks, vs, dout)]
    qs, ks, vs = (x.requires_grad_(True) for x in (qs, ks, vs))
    out = at.flash_attention(qs, ks, vs, causal=True)
    out.backward(dout)
    for before, after in zip(saved, (qs, ks, vs, dout)):
        assert torch.equal(before, after.detach())
    ref = reference.float64(q, k, v, causal=True).out
    base, _ = reference.baseline(q, k, v, causal=True)
    assert_close_by_rule(out, ref, base, factor=2)


def test_low_level_ops_match_autograd(case_type, inputs, at):
    """flash_attention_forward/backward (used by ring attention) equal the autograd path,
    including the gradient that flows in through the LSE."""
    case = case_type(H=2, Hkv=1, Tq=T_SHORT, Tk=T_MID, causal=True, softcap=4.0)
    q, k, v, _, dout, dlse = inputs(case, DTYPES[0])
    opts = case.options(None)
    out, lse = at.flash_attention_forward(q, k, v, **opts)
    out64, lse64 = at.flash_attention_forward(q, k, v, **opts, lse_dtype=torch.float64)
    assert lse64.dtype == torch.float64 and torch.equal(out64, out)
    # The float64 LSE is the kernel's (hi, lo) pair: its float32 rounding is the public LSE.
    assert torch.equal(lse64.float(), lse)
    dq, dk, dv = at.flash_attention_backward(dout, q, k, v, out, lse64, dlse=dlse, **opts)
    qa, ka, va = (x.detach().clone().requires_grad_(True) for x in (q, k, v))
    out_a, lse_a = at.flash_attention(qa, ka, va, **opts, return_lse=True)
    ((out_a * dout).sum() + (lse_a * dlse).sum()).backward()
    assert torch.equal(out, out_a.detach()) and torch.equal(lse, lse_a.detach())
    # Equal up to float64's rounding of hi + lo (a lo far below hi's last bit).
    for a, b in ((dq, qa.grad), (dk, ka.grad), (dv, va.grad)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # From the float32 LSE the recomputed P carries its rounding: close, not equal.
    low = at.flash_attention_backward(dout, q, k, v, out, lse, dlse=dlse, **opts)
    for a, b in zip(low, (dq, dk, dv)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_backward_is_deterministic(case_type, inputs, at):
    case = case_type(H=2, Hkv=1, Tq=T_SHORT, Tk=T_MID, causal=True)
    q, k, v, _, dout, _ = inputs(case, DTYPES[0])
    out, lse = at.flash_attention_forward(q, k, v, causal=True)
    first = at.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    second = at.flash_attention_backward(dout, q, k, v, out, lse, causal=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "bad, error, words",
    [
        (dict(k=(1, 3, 8, 32), v=(1, 3, 8, 32)), ValueError, "Hkv=3"),
        (dict(k=(1, 2, 8, 16)), ValueError, "Dk"),
        (dict(v=(1, 2, 9, 32)), ValueError, "k (1, 2, 8, 32), v (1, 2, 9, 32)"),
        (dict(q=(2, 32)), ValueError, "(B, H, Tq, Dk)"),
        (dict(k=(2, 2, 8, 32), v=(2, 2, 8, 32)), ValueError, "batch size B"),
        (dict(q=(1, 2, 8, 512), k=(1, 2, 8, 512), v=(1, 2, 8, 512)), ValueError, "512"),
    ],
)
def test_bad_shapes_raise_with_the_shapes(bad, error, words, at):
    shapes = {**dict(q=(1, 2, 8, 32), k=(1, 2, 8, 32), v=(1, 2, 8, 32)), **bad}
    t = {n: torch.zeros(s, device=DEVICE) for n, s in shapes.items()}
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        at.flash_attention(t["q"], t["k"], t["v"])


def test_bad_options_raise(at):
    x = torch.zeros(1, 2, 8, 32, device=DEVICE)
    with pytest.raises(TypeError, match="dtype"):
        at.flash_attention(x, x.half(), x)
    with pytest.raises(TypeError, match="window"):
        at.flash_attention(x, x, x, window=3)
    with pytest.raises(ValueError, match="alibi_slopes"):
        at.flash_attention(x, x, x, alibi_slopes=torch.ones(3))
    with pytest.raises(ValueError, match="softcap"):
        at.flash_attention(x, x, x, softcap=0.0)


def test_is_available_here(at):
    # Either a CUDA device or the interpreter that conftest switched on.
    assert at.is_available()
    assert math.isfinite(float(at.flash_attention_forward(
        torch.ones(1, 1, 1, 16, device=DEVICE), torch.ones(1, 1, 1, 16, device=DEVICE),
        torch.ones(1, 1, 1, 16, device=DEVICE))[1]))


def test_broadcast_output_gradient(case_type, inputs, reference, at):
    """``out.sum().backward()`` hands the kernel a stride-0 dO; gradients still follow
    the rule."""
    case = case_type(Tq=T_SHORT, Tk=T_MID, causal=True)
    q, k, v, _, _, _ = inputs(case, DTYPES[0])
    grads = []
    for fn in (lambda a, b, c: at.flash_attention(a, b, c, causal=True),
               lambda a, b, c: reference.baseline(a, b, c, causal=True)[0]):
        xs = [x.detach().requires_grad_(True) for x in (q, k, v)]
        fn(*xs).sum().backward()
        grads.append([x.grad for x in xs])
    ones = torch.ones(case.B, case.H, case.Tq, case.dv)
    r = reference.float64(q, k, v, causal=True, dout=ones)
    grads.append([r.dq, r.dk, r.dv])
    for i, (name, factor) in enumerate([("dq", 5), ("dk", 3), ("dv", 3)]):
        assert_close_by_rule(grads[0][i], grads[2][i], grads[1][i], factor=factor, name=name)


def test_batch_beyond_the_grid_y_cap_is_launched_in_slices(case_type, inputs, at,
                                                           monkeypatch):
    """CUDA caps grid axis 1 (B * H programs) at 65535; past that the batch is split. The
    interpreter has no cap, so the cap is lowered here (to 2: B * H = 6 takes 3 launches
    of one batch row each, forward and backward), and results must equal one launch bit
    for bit."""
    import attnkit.triton._launch as flash

    case = case_type(B=3, H=2, Hkv=1, Tq=T_SHORT, Tk=T_MID, causal=True, alibi="bh")
    q, k, v, slopes, dout, dlse = inputs(case, DTYPES[0])
    opts = case.options(slopes)
    whole = at.flash_attention_forward(q, k, v, **opts)
    whole_g = at.flash_attention_backward(dout, q, k, v, *whole, dlse=dlse, **opts)
    monkeypatch.setattr(flash, "_MAX_GRID_Y", 4)
    assert flash._batch_slices(3, 2) == [slice(0, 2), slice(2, 3)]
    monkeypatch.setattr(flash, "_MAX_GRID_Y", 2)
    assert flash._batch_slices(3, 2) == [slice(0, 1), slice(1, 2), slice(2, 3)]
    split = at.flash_attention_forward(q, k, v, **opts)
    split_g = at.flash_attention_backward(dout, q, k, v, *split, dlse=dlse, **opts)
    for a, b in zip((*whole, *whole_g), (*split, *split_g)):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="H=3"):
        flash._batch_slices(1, 3)


def test_views_whose_offsets_overflow_int32_are_made_dense():
    """In-slice offsets are int32 in the kernels: a transposed (B, T, H, D) view with
    T * H * D >= 2^31 must reach them as a dense copy, anything smaller as it is (meta
    tensors: the check needs strides, not 4 GiB of data)."""
    from attnkit.triton._launch import _int32_offsets

    def view(T, H, D):  # (B, T, H, D) storage seen as (B, H, T, D)
        return torch.empty(1, T, H, D, device="meta").transpose(1, 2)

    big = view(262144, 128, 128)  # last row starts at 262143 * 16384 > 2^31
    fixed = _int32_offsets(big)
    assert fixed.is_contiguous() and fixed.shape == big.shape
    packed = torch.empty(1, 131072, 3, 64, 128, device="meta")[:, :, 0].transpose(1, 2)
    assert _int32_offsets(packed).is_contiguous()  # 131071 * 24576 > 2^31
    small = view(131072, 128, 128)  # 131071 * 16384 + 127 < 2^31: fits exactly
    assert _int32_offsets(small) is small
    dense = torch.empty(1, 128, 131072, 128, device="meta")
    assert _int32_offsets(dense) is dense


@pytest.mark.parametrize(
    "window, same_as",
    [((None, 2**31 - 1), None), ((2**31 - 10, 2**31 - 10), None), ((10**12, 0), (None, 0)),
     ((-(2**31) + 5, None), "empty"), ((None, -(2**31) + 5), "empty")],
    ids=["right_int32_max", "both_near_int32_max", "left_beyond_int64", "left_very_negative",
         "right_very_negative"],
)
def test_window_sides_wider_than_the_sequence(window, same_as, case_type, inputs, at):
    """A side beyond Tq + Tk keeps (or, negative, drops) every key: results equal the
    unbounded side (or 0 and -inf), forward and backward, not an int32 wrap-around."""
    case = case_type(Tq=T_SHORT, Tk=T_MID)
    q, k, v, _, dout, _ = inputs(case, DTYPES[0])
    out, lse = at.flash_attention_forward(q, k, v, window=window)
    grads = at.flash_attention_backward(dout, q, k, v, out, lse, window=window)
    if same_as == "empty":
        assert torch.all(out == 0) and torch.all(lse == float("-inf"))
        assert all(torch.all(g == 0) for g in grads)
        return
    ref_out, ref_lse = at.flash_attention_forward(q, k, v, window=same_as)
    ref_grads = at.flash_attention_backward(dout, q, k, v, ref_out, ref_lse, window=same_as)
    for a, b in zip((out, lse, *grads), (ref_out, ref_lse, *ref_grads)):
        assert torch.equal(a, b)


def test_numpy_integer_window_sides_work_as_in_numpy(case_type, inputs, at):
    """Window sides are checked by attnkit.spec for every backend: NumPy integers (say,
    from an array of per-layer windows) are accepted, as attnkit.numpy accepts them."""
    case = case_type(Tq=T_SHORT, Tk=T_MID)
    q, k, v, _, _, _ = inputs(case, DTYPES[0])
    want = at.flash_attention(q, k, v, window=(9, 4))
    got = at.flash_attention(q, k, v, window=(np.int64(9), np.int32(4)))
    assert torch.equal(got, want)


def test_double_backward_raises_instead_of_dropping_second_order_terms(at):
    """The kernels have no double backward: a gradient penalty through them must fail
    loudly, not silently treat dQ as a constant."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, T_SHORT, 16, generator=g).to(DEVICE, DTYPES[0])
               for _ in range(3))
    q.requires_grad_(True)
    out = at.flash_attention(q, k, v)
    (dq,) = torch.autograd.grad((out * out).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate"):
        (dq.pow(2).sum() + q.sum()).backward()
