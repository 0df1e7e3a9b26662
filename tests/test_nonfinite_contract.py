"""DESIGN.md, "Non-finite values and empty rows", point by point, on every backend.

Backends: the NumPy oracle (``numpy``), ``attnkit.torch.attention`` on each path
(``auto``, ``sdpa``, ``math``), the Triton kernels through that function (``triton``; under
``TRITON_INTERPRET=1`` on the CPU, the dispatcher told to take CPU float32 tensors), and
ring attention on one process with its block op (``ring``).

1. A query with no allowed key: output 0, LSE -inf, weights 0, zero gradients.
2. Masked scores never enter the softmax; returned weights are exactly 0 at masked keys.
3. NaN/inf in an attended position propagates, forward and backward.
4. What a masked position holds is the caller's: the oracle selects it away; a fused path
   may let it through ``0 * nan`` (then the row is NaN, never silently wrong). attnkit puts
   none there itself (the KV cache starts as zeros). ``check_finite=True`` finds it.
5. No device-side asserts: bad ``valid_lens`` raise ``ValueError`` on the CPU, are clamped
   off it.
6. No default path reads a tensor back or breaks a ``torch.compile`` graph.
"""

from __future__ import annotations

import math
import os
import pathlib

import numpy as np
import pytest
import torch
import torch._dynamo.testing

import attnkit
import attnkit.numpy as an
import attnkit.torch as at
import attnkit.torch._signature as _signature
from attnkit.distributed import block_forward, ring_attention
from attnkit.torch import masks
from attnkit.torch._triton_path import triton_kernels

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernels are first loaded
TRITON = triton_kernels("flash_attention") is not None

BACKENDS = ["numpy", "auto", "sdpa", "math", "triton", "ring"]
B, H, T, D = 2, 2, 8, 16
# Batch 0: positions 5-7 are padding (no key for those queries, no query for those keys).
IDS = torch.tensor([[0] * 5 + [-1] * 3, [0] * 4 + [1] * 4])


def _inputs(seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, T, D, generator=g, dtype=torch.float64) for _ in range(4)]


@pytest.fixture
def via_triton(monkeypatch):
    """The dispatcher's answer for a CUDA half-precision call, for CPU float32 tensors
    (decided per call signature: from an empty table, which is put back afterwards)."""
    monkeypatch.setattr(_signature, "_PREPARED", {})
    monkeypatch.setattr(_signature, "triton_reason", lambda *a, **k: None)


def run(backend: str, q, k, v, dout, **kw) -> dict[str, np.ndarray | None]:
    """``out``, ``w`` (weights), ``lse``, ``dq``, ``dk``, ``dv`` of one backend as float64
    arrays (None where the backend has no such output)."""
    if backend == "triton" and not TRITON:
        pytest.skip("attnkit.triton cannot run here")
    if backend == "numpy":
        arrays = [x.detach().numpy() for x in (q, k, v)]
        nkw = {n: (x.numpy() if isinstance(x, torch.Tensor) else x) for n, x in kw.items()}
        (out, w), pull = an.vjp(an.scaled_dot_product_attention, *arrays, **nkw)
        grads = pull(dout.numpy())
        lse = None
        if "valid_lens" not in nkw:
            lse = an.flash_attention(*arrays, return_lse=True, **nkw)[1]
        return dict(out=out, w=w, lse=lse, dq=grads[0], dk=grads[1], dv=grads[2])
    dt = torch.float32 if backend == "triton" else torch.float64
    leaves = [x.to(dt).requires_grad_(True) for x in (q, k, v)]
    if backend == "ring":
        out = ring_attention(*leaves, **kw)
        w = None
        bkw = dict(kw)
        if "valid_lens" in bkw:  # the block op takes padding as a key mask
            bkw["key_mask"] = torch.arange(T) < bkw.pop("valid_lens")[:, None]
        with torch.no_grad():
            lse = block_forward(q, k, v, scale=None, **{"causal": False, **bkw})[1]
    else:
        name = "triton" if backend == "triton" else backend
        out, _ = at.attention(*leaves, backend=name, **kw)
        with torch.no_grad():
            _, w = at.attention(*leaves, backend=name, need_weights=True, **kw)
        lse = None
        if backend == "triton":
            kernels = triton_kernels("flash_attention")
            seg = kw.get("segment_ids")
            lse = kernels.flash_attention(*(x.detach() for x in leaves), return_lse=True,
                                          causal=kw.get("causal", False),
                                          segment_ids=None if seg is None else (seg, seg))[1]
    out.backward(dout.to(dt))
    as_np = lambda x: None if x is None else x.detach().double().numpy()  # noqa: E731
    return dict(out=as_np(out), w=as_np(w), lse=as_np(lse),
                dq=as_np(leaves[0].grad), dk=as_np(leaves[1].grad), dv=as_np(leaves[2].grad))


def _tol(backend: str) -> dict:
    return {"rtol": 1e-4, "atol": 1e-5} if backend == "triton" else {"rtol": 1e-9, "atol": 1e-11}


# -- 1. empty rows -------------------------------------------------------------------------


# The Triton kernel takes segment ids but no valid_lens (attention() sends those elsewhere):
# its empty rows come from segment ids only.
EMPTY_ROW_CASES = [
    (backend, kw) for backend in BACKENDS
    for kw in ({"segment_ids": IDS}, {"segment_ids": IDS, "causal": True},
               {"valid_lens": torch.tensor([0, 6])})
    if not (backend == "triton" and "valid_lens" in kw)
]


@pytest.mark.parametrize(("backend", "kw"), EMPTY_ROW_CASES, ids=str)
def test_1_a_query_with_no_key_gets_zeros_and_minus_inf(backend, kw, request):
    if backend == "triton":
        request.getfixturevalue("via_triton")
    q, k, v, dout = _inputs()
    got = run(backend, q, k, v, dout, **kw)
    empty = (slice(0, 1), slice(None), slice(5, 8)) if "segment_ids" in kw else \
        (slice(0, 1), slice(None), slice(None))
    assert (got["out"][empty] == 0).all(), "output of a query with no key"
    assert (got["dq"][empty] == 0).all(), "dq of a query with no key"
    if got["w"] is not None:
        assert (got["w"][empty] == 0).all(), "weights of a query with no key"
    if got["lse"] is not None:
        assert np.isneginf(got["lse"][empty]).all(), "lse of a query with no key"
    keys = empty if "segment_ids" in kw else (slice(0, 1), slice(None), slice(None))
    assert (got["dk"][keys] == 0).all() and (got["dv"][keys] == 0).all(), "dk/dv of unused keys"
    ref = run("numpy", q, k, v, dout, **kw)
    for name in ("out", "dq", "dk", "dv"):
        np.testing.assert_allclose(got[name], ref[name], err_msg=name, **_tol(backend))


# -- 2. masked weights ----------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the oracle's NaN
@pytest.mark.parametrize("backend", ["numpy", "auto", "sdpa", "math", "triton"])
def test_2_weights_are_exactly_0_at_masked_keys_even_in_a_nan_row(backend, request):
    """A row that attends a NaN key has NaN weights at its allowed keys (plain math), and
    still exactly 0 at its masked ones."""
    if backend == "triton":
        request.getfixturevalue("via_triton")
    q, k, v, dout = _inputs(1)
    k[1, 0, 2, 3] = math.nan  # attended (causal) by queries 2..7 of batch 1, head 0
    got = run(backend, q, k, v, dout, causal=True)
    allowed = np.tril(np.ones((T, T), dtype=bool))
    assert (got["w"][..., ~allowed] == 0).all()
    assert np.isnan(got["w"][1, 0, 2:][allowed[2:]]).all()
    assert np.isfinite(got["w"][0]).all() and np.isfinite(got["w"][1, 1]).all()
    np.testing.assert_allclose(got["w"][0].sum(-1), 1.0, **_tol(backend))


def test_2_a_large_negative_bias_is_not_a_mask():
    """-1e30 is a score, not "excluded": a row whose every key has it is uniform, as in
    plain math (only -inf or a mask excludes), on every torch path."""
    q, k, v, _ = _inputs(2)
    bias = torch.full((T, T), -1e30, dtype=torch.float64)
    for backend in ("sdpa", "math"):
        _, w = at.attention(q, k, v, bias=bias, need_weights=True, backend=backend)
        torch.testing.assert_close(w, torch.full_like(w, 1 / T))


# -- 3. attended NaN/inf propagates -----------------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the oracle's NaN
@pytest.mark.parametrize("backend", BACKENDS)
def test_3_nan_and_inf_in_attended_positions_propagate(backend, request):
    if backend == "triton":
        request.getfixturevalue("via_triton")
    q, k, v, dout = _inputs(3)
    v[0, 1, 4, 2] = math.nan  # every query of (0, 1) attends key 4: feature 2 is NaN
    v[1, 0, 6, 5] = math.inf  # feature 5 of (1, 0): +inf
    k[1, 1, 3, 0] = math.nan  # every score of (1, 1) at key 3: the whole head is NaN
    got = run(backend, q, k, v, dout)
    ref = run("numpy", q, k, v, dout)
    np.testing.assert_array_equal(np.isnan(got["out"]), np.isnan(ref["out"]))
    np.testing.assert_array_equal(np.isposinf(got["out"]), np.isposinf(ref["out"]))
    assert np.isnan(got["out"][0, 1, :, 2]).all() and np.isnan(got["out"][1, 1]).all()
    fin = np.isfinite(ref["out"])
    np.testing.assert_allclose(got["out"][fin], ref["out"][fin], **_tol(backend))
    for name in ("dq", "dk", "dv"):  # backward: NaN where plain math has it, and only there
        assert np.isnan(got[name][1, 1]).any(), name  # a NaN key: every gradient of the head
        assert np.isfinite(got[name][0, 0]).all(), name
    assert np.isnan(got["dq"][0, 1]).any() and np.isnan(got["dk"][0, 1]).any()  # dO V^T
    np.testing.assert_array_equal(np.isnan(got["dv"]), np.isnan(ref["dv"]))


def test_3_a_nan_stored_in_the_kv_cache_propagates_like_the_full_forward():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(12, 2, dtype=torch.float64)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    x[1, 2] = math.nan
    cache = m.init_cache(2, 8)
    with torch.no_grad():
        outs = [m(x[:, :2], cache=cache)[0]] + [m(x[:, t:t + 1], cache=cache)[0]
                                                for t in range(2, 6)]
    got = torch.cat(outs, dim=1)  # no mask: every step attends every cached position
    assert torch.isnan(got[1, 2:]).all() and torch.isfinite(got[1, :2]).all()
    assert torch.isfinite(got[0]).all()


# -- 4. masked positions are the caller's ---------------------------------------------------


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("backend", BACKENDS)
def test_4_a_masked_nan_is_selected_away_by_the_oracle_and_may_only_nan_a_fused_row(
        backend, request):
    """The NumPy oracle never lets a masked NaN through (exact semantics). Another path
    may (``0 * nan`` inside a fused kernel, as in SDPA): then it can only turn a row into
    NaN, never into a wrong finite value, so that is all this asserts there."""
    if backend == "triton":
        request.getfixturevalue("via_triton")
    q, k, v, dout = _inputs(4)
    v[0, 0, 6, 1] = math.nan  # padding of batch 0 (IDS): no query may attend it
    k[0, 1, 7, 0] = math.inf
    got = run(backend, q, k, v, dout, segment_ids=IDS)
    clean = run("numpy", *(x.nan_to_num(0.0, 0.0, 0.0) for x in (q, k, v)), dout,
                segment_ids=IDS)
    if backend == "numpy":
        np.testing.assert_allclose(got["out"], clean["out"], rtol=1e-12, atol=1e-14)
        return
    same = np.isclose(got["out"], clean["out"], **_tol(backend))
    assert (same | np.isnan(got["out"])).all()


def test_4_the_kv_cache_starts_as_zeros_and_leaves_unused_slots_alone():
    torch.manual_seed(0)
    m = at.MultiHeadAttention(8, 2)
    cache = m.init_cache(2, 6)
    assert (cache.k == 0).all() and (cache.v == 0).all()
    with torch.no_grad():
        m(torch.randn(2, 3, 8), causal=True, cache=cache)
    assert (cache.k[:, :, 3:] == 0).all() and (cache.v[:, :, 3:] == 0).all()
    assert not hasattr(cache, "nonfinite")


@pytest.mark.parametrize("where, said", [
    (("q", (1, 0, 2, 3)), "q (2, 2, 4, 5) holds nan at batch (1,), head 0, position 2 "
                          "(feature 3); that position is attended"),
    (("k", (0, 1, 5, 0)), "k (2, 2, 6, 5) holds inf at batch (0,), head 1, position 5 "
                          "(feature 0); that position is masked"),
    (("v", (1, 0, 1, 4)), "v (2, 2, 6, 5) holds -inf at batch (1,), head 0, position 1 "
                          "(feature 4); that position is attended"),
    (("q", (0, 1, 0, 0)), "q (2, 2, 4, 5) holds nan at batch (0,), head 1, position 0 "
                          "(feature 0); that position is masked"),
])
def test_4_check_finite_names_the_first_non_finite_entry(where, said):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 2, 4, 5, generator=g)
    k, v = torch.randn(2, 2, 6, 5, generator=g), torch.randn(2, 2, 6, 5, generator=g)
    name, idx = where
    x = {"q": q, "k": k, "v": v}[name]
    x[idx] = {"q": math.nan, "k": math.inf, "v": -math.inf}[name]
    vl = torch.tensor([4, 6])  # batch 0: keys 4, 5 are padding
    mask = torch.ones(2, 2, 4, 6, dtype=torch.bool)
    mask[0, 1, 0] = False  # batch 0, head 1, query 0 has no key
    with pytest.raises(ValueError) as err:
        at.attention(q, k, v, valid_lens=vl, mask=mask, check_finite=True)
    assert str(err.value) == said
    at.attention(q, k, v, valid_lens=vl, mask=mask)  # off by default: no error


# -- 5. valid_lens: no device-side assert --------------------------------------------------


@pytest.mark.parametrize("vl, said", [
    (torch.tensor([3, 9]), "got min 3 and max 9"),
    (torch.tensor([-1, 2]), "got min -1 and max 2"),
    (torch.tensor([math.inf, 3.0]), "got min 3 and max inf"),
])
def test_5_bad_valid_lens_raise_on_the_cpu_naming_min_and_max(vl, said):
    q = torch.randn(2, 2, 4, 5)
    k = torch.randn(2, 2, 6, 5)
    with pytest.raises(ValueError, match=r"valid_lens must lie in \[0, 6\].*" + said):
        at.attention(q, k, k, valid_lens=vl)
    with pytest.raises(ValueError, match=said):
        at.sequence_mask(vl, 6)


def test_5_off_the_cpu_bad_valid_lens_are_clamped_to_0_and_tk(monkeypatch):
    monkeypatch.setattr(masks, "_on_host", lambda x: False)  # what a CUDA tensor gets
    q, k, v, _ = _inputs(5)
    for bad, clamped in (([-3, 20], [0, 8]), ([math.inf, 2.0], [8, 2])):
        got, _ = at.attention(q, k, v, valid_lens=torch.tensor(bad))
        want, _ = at.attention(q, k, v, valid_lens=torch.tensor(clamped))
        torch.testing.assert_close(got, want)


def test_5_no_device_side_assert_anywhere_in_attnkit():
    root = pathlib.Path(attnkit.__file__).parent
    users = [p for p in root.rglob("*.py") if "_assert_async" in p.read_text()]
    assert not users, users


# -- 6. no host sync, no graph break -----------------------------------------------------------


def test_6_a_gpu_like_padded_call_reads_nothing_back_and_compiles_whole(monkeypatch):
    """valid_lens off the CPU (clamped, not read), a causal block, and the ring block op."""
    monkeypatch.setattr(masks, "_on_host", lambda x: False)

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor was read back to Python (a host sync)")

    q, k, v, _ = _inputs(6)
    vl = torch.tensor([5, 8])
    want = at.attention(q, k, v, valid_lens=vl, causal=True)[0]
    with monkeypatch.context() as m:
        for name in ("item", "__bool__", "__int__", "__float__", "__index__", "tolist"):
            m.setattr(torch.Tensor, name, refuse)
        at.attention(q, k, v, valid_lens=vl, causal=True)
        block_forward(q, k, v, causal=True, scale=0.3)
    torch._dynamo.reset()
    counter = torch._dynamo.testing.CompileCounterWithBackend("aot_eager")
    fn = torch.compile(lambda q, k, v, vl: at.attention(q, k, v, valid_lens=vl, causal=True)[0],
                       fullgraph=True, backend=counter)
    torch.testing.assert_close(fn(q, k, v, vl), want)
    assert counter.frame_count == 1


# -- a decoding step is SDPA with its mask: same answer as the math path ----------------------


@pytest.mark.parametrize("G", [1, 4])
@pytest.mark.parametrize("kw", ["valid_lens", "key_mask", "per_head_mask", "causal"])
def test_decoding_step_equals_math(G, kw):
    g = torch.Generator().manual_seed(G)
    Hkv, Tk = 2, 37
    q = torch.randn(3, Hkv * G, 1, 8, generator=g)
    k, v = torch.randn(3, Hkv, Tk, 8, generator=g), torch.randn(3, Hkv, Tk, 10, generator=g)
    vl = torch.tensor([Tk, Tk - 7, 0])
    opts = {
        "valid_lens": {"valid_lens": vl},
        "key_mask": {"mask": (torch.arange(Tk) < vl[:, None])[:, None, None, :]},
        "per_head_mask": {"mask": torch.rand(3, Hkv * G, 1, Tk, generator=g) > 0.4},
        "causal": {"causal": True},
    }[kw]
    with torch.no_grad():
        got, _ = at.attention(q, k, v, **opts)
        want, _ = at.attention(q, k, v, backend="math", **opts)
    torch.testing.assert_close(got, want)
    if kw in ("valid_lens", "key_mask"):
        assert (got[2] == 0).all()  # no key: output 0


@pytest.mark.skipif(not TRITON, reason="attnkit.triton cannot run here")
def test_4_a_nan_query_with_no_key_on_triton_is_the_callers_as_documented():
    """The kernel gives the row output 0 and dQ 0; its NaN may reach dK (0 * NaN in
    dS^T Q), and docs/triton.md says so (it used to promise "zero gradients; no NaN")."""
    kernels = triton_kernels("flash_attention")
    q, k, v, dout = (x.float() for x in _inputs(7))
    q[0, 0, 6] = math.nan  # batch 0, query 6: padding (IDS), no key
    q.requires_grad_(True)
    out = kernels.flash_attention(q, k, v, segment_ids=(IDS, IDS))
    out.backward(dout)
    assert (out[0, :, 5:] == 0).all() and (q.grad[0, :, 5:] == 0).all()
    assert torch.isfinite(out).all() and torch.isfinite(q.grad).all()
    doc = (pathlib.Path(__file__).parents[1] / "docs" / "triton.md").read_text()
    assert "zero gradients; no NaN" not in doc and "can reach dK" in doc
