"""attnkit.torch.attention against the float64 NumPy reference, on every path."""

from __future__ import annotations

import importlib.util
import sys
import types

import numpy as np
import pytest
import torch

import attnkit
import attnkit.numpy as an
import attnkit.torch as at
from attnkit.testing import reference_attention


def t64(x: np.ndarray, requires_grad: bool = False) -> torch.Tensor:
    return torch.tensor(np.asarray(x), dtype=torch.float64, requires_grad=requires_grad)


def npy(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


BACKENDS = ["math", "sdpa", "auto"]

# (B, H, Hkv, Tq, Tk, Dk, Dv): odd head dims, lengths off block multiples, Tq != Tk both
# ways, MHA / GQA / MQA.
SHAPES = [
    (2, 4, 4, 5, 5, 7, 7),
    (1, 4, 2, 97, 33, 59, 59),
    (2, 3, 1, 1, 97, 1, 7),
    (1, 2, 2, 33, 113, 111, 16),
    (1, 2, 1, 1025, 17, 8, 8),
]

CONSTRAINTS = [
    {},
    {"causal": True},
    {"window": (3, 1)},
    {"causal": True, "window": (5, None)},
    {"mask": "random"},
    {"valid_lens": "1d"},
    {"valid_lens": "2d"},
    {"bias": True},
    {"causal": True, "mask": "random", "valid_lens": "1d", "bias": True, "window": (None, 2)},
]


def _case(rng: np.random.Generator, shape: tuple, constraints: dict) -> tuple[dict, dict]:
    """NumPy inputs and keyword arguments for both implementations."""
    B, H, Hkv, Tq, Tk, Dk, Dv = shape
    arrays = {
        "q": rng.standard_normal((B, H, Tq, Dk)),
        "k": rng.standard_normal((B, Hkv, Tk, Dk)),
        "v": rng.standard_normal((B, Hkv, Tk, Dv)),
    }
    kw: dict = {}
    for name, val in constraints.items():
        if name == "mask":
            kw["mask"] = rng.random((B, 1, Tq, Tk)) > 0.3
        elif name == "valid_lens" and val == "1d":
            kw["valid_lens"] = rng.integers(0, Tk + 1, size=B)
            kw["valid_lens"][0] = Tk // 2  # at least one non-trivial length
        elif name == "valid_lens":
            kw["valid_lens"] = rng.integers(0, Tk + 1, size=(B, Tq))
        elif name == "bias":
            b = rng.standard_normal((1, H, Tq, Tk))
            b[..., : max(1, Tk // 4)] = -np.inf  # bias can exclude keys too
            kw["bias"] = b
        else:
            kw[name] = val
    return arrays, kw


def _torch_kw(kw: dict) -> dict:
    out = {}
    for name, val in kw.items():
        if isinstance(val, np.ndarray):
            out[name] = t64(val) if val.dtype == np.float64 else torch.from_numpy(val)
        else:
            out[name] = val
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("constraints", CONSTRAINTS, ids=lambda c: "+".join(c) or "none")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_matches_numpy_float64(rng, shape, constraints, backend):
    arrays, kw = _case(rng, shape, constraints)
    ref_out, ref_w = an.scaled_dot_product_attention(arrays["q"], arrays["k"], arrays["v"], **kw)
    q, k, v = (t64(arrays[n]) for n in "qkv")
    out, w = at.attention(q, k, v, **_torch_kw(kw), need_weights=True, backend=backend)
    np.testing.assert_allclose(npy(out), ref_out, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(npy(w), ref_w, rtol=1e-10, atol=1e-12)
    out2, none = at.attention(q, k, v, **_torch_kw(kw), backend=backend)
    assert none is None
    np.testing.assert_allclose(npy(out2), ref_out, rtol=1e-10, atol=1e-12)


def test_no_head_axis_and_broadcast_batch(rng):
    q, k, v = rng.standard_normal((3, 4, 6)), rng.standard_normal((1, 9, 6)), rng.standard_normal(
        (1, 9, 5)
    )
    for backend in BACKENDS:
        out, w = at.attention(t64(q), t64(k), t64(v), causal=True, need_weights=True,
                              backend=backend)
        ref_out, ref_w = an.scaled_dot_product_attention(q, k, v, causal=True)
        np.testing.assert_allclose(npy(out), ref_out, rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(npy(w), ref_w, rtol=1e-12, atol=1e-13)
    q2, k2, v2 = (rng.standard_normal(s) for s in ((7, 5), (3, 5), (3, 2)))
    out, _ = at.attention(t64(q2), t64(k2), t64(v2))
    ref = an.scaled_dot_product_attention(q2, k2, v2)[0]
    np.testing.assert_allclose(npy(out), ref, rtol=1e-12)


def test_custom_scale(rng):
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    ref, _ = an.scaled_dot_product_attention(q, k, v, scale=0.37, causal=True)
    for backend in BACKENDS:
        out, _ = at.attention(t64(q), t64(k), t64(v), scale=0.37, causal=True, backend=backend)
        np.testing.assert_allclose(npy(out), ref, rtol=1e-12)


@pytest.mark.parametrize("backend", BACKENDS)
def test_gqa_equals_repeated_heads(rng, backend):
    q = t64(rng.standard_normal((2, 6, 9, 5)))
    k, v = t64(rng.standard_normal((2, 2, 11, 5))), t64(rng.standard_normal((2, 2, 11, 3)))
    vl = torch.tensor([11, 4])
    out, w = at.attention(q, k, v, causal=True, valid_lens=vl, need_weights=True,
                          backend=backend)
    rep = at.attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), causal=True,
                       valid_lens=vl, need_weights=True, backend=backend)
    torch.testing.assert_close(out, rep[0], rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(w, rep[1], rtol=1e-13, atol=1e-14)


@pytest.mark.parametrize("backend", ["math", "sdpa"])
@pytest.mark.parametrize("G", [1, 2])
def test_gradcheck(rng, backend, G):
    B, Hkv, Tq, Tk, D = 2, 1, 4, 5, 3
    q = t64(rng.standard_normal((B, Hkv * G, Tq, D)), requires_grad=True)
    k = t64(rng.standard_normal((B, Hkv, Tk, D)), requires_grad=True)
    v = t64(rng.standard_normal((B, Hkv, Tk, 2)), requires_grad=True)
    bias = t64(rng.standard_normal((1, 1, Tq, Tk)), requires_grad=True)
    mask = torch.tensor(rng.random((B, 1, Tq, Tk)) > 0.3)
    mask[0, 0, 1] = False  # a fully masked row

    def fn(q, k, v, bias):
        out, w = at.attention(q, k, v, mask=mask, bias=bias, causal=True, need_weights=True,
                              backend=backend)
        return out, w

    assert torch.autograd.gradcheck(fn, (q, k, v, bias))


def test_gradgradcheck_math_path(rng):
    q, k, v = (t64(rng.standard_normal((1, 2, 3, 2)), requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, True], [False, False, False], [True, True, True]])

    def fn(q, k, v):
        return at.attention(q, k, v, mask=mask, backend="math")[0]

    assert torch.autograd.gradgradcheck(fn, (q, k, v))


DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("need_weights", [False, True])
def test_fully_masked_rows_zero_output_and_grads(rng, backend, dtype, need_weights):
    B, H, Tq, Tk, D = 2, 2, 5, 6, 4
    q, k, v = (
        torch.tensor(rng.standard_normal(s), dtype=dtype, requires_grad=True)
        for s in ((B, H, Tq, D), (B, H, Tk, D), (B, H, Tk, D))
    )
    vl = torch.tensor([0, 4])  # batch 0: every row empty
    mask = torch.ones(B, H, Tq, Tk, dtype=torch.bool)
    mask[1, :, 2] = False  # batch 1: row 2 empty
    out, w = at.attention(q, k, v, mask=mask, valid_lens=vl, need_weights=need_weights,
                          backend=backend)
    loss = out.float().sum() + (w.float().sum() if need_weights else 0.0)
    loss.backward()
    assert not torch.isnan(out).any()
    assert torch.all(out[0] == 0) and torch.all(out[1, :, 2] == 0)
    if need_weights:
        assert torch.all(w[0] == 0) and torch.all(w[1, :, 2] == 0)
        torch.testing.assert_close(w[1, :, 3].float().sum(-1), torch.ones(H), atol=1e-2, rtol=0)
    for g in (q.grad, k.grad, v.grad):
        assert not torch.isnan(g).any()
    assert torch.all(q.grad[0] == 0) and torch.all(q.grad[1, :, 2] == 0)
    assert torch.all(k.grad[0] == 0) and torch.all(v.grad[0] == 0)
    assert torch.all(k.grad[1, :, 4:] == 0)  # keys beyond valid_len get no gradient


@pytest.mark.parametrize("backend", BACKENDS)
def test_bias_all_minus_inf_row_is_empty(backend):
    q, k, v = (torch.randn(1, 1, 3, 4, dtype=torch.float64) for _ in range(3))
    bias = torch.zeros(1, 1, 3, 3, dtype=torch.float64)
    bias[..., 1, :] = float("-inf")
    out, w = at.attention(q, k, v, bias=bias, need_weights=True, backend=backend)
    assert torch.all(out[..., 1, :] == 0) and torch.all(w[..., 1, :] == 0)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_tensors_unchanged(rng, backend):
    q, k, v = (t64(rng.standard_normal((2, 2, 5, 3)), requires_grad=True) for _ in range(3))
    bias = t64(rng.standard_normal((2, 1, 5, 5)))
    mask = torch.tensor(rng.random((2, 2, 5, 5)) > 0.5)
    vl = torch.tensor([3, 5])
    before = [x.detach().clone() for x in (q, k, v, bias)] + [mask.clone(), vl.clone()]
    versions = [x._version for x in (q, k, v, bias, mask, vl)]
    out, w = at.attention(q, k, v, mask=mask, bias=bias, valid_lens=vl, causal=True,
                          need_weights=True, backend=backend)
    (out.sum() + w.sum()).backward()
    for x, b in zip((q, k, v, bias, mask, vl), before):
        assert torch.equal(x.detach(), b)
    assert versions == [x._version for x in (q, k, v, bias, mask, vl)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_tensors_unchanged_causal_only(rng, backend):
    """Tq == Tk with causal alone takes SDPA's own causal flag; the weights beside it are
    masked in place, which must stay inside attnkit's private score buffer."""
    q, k, v = (t64(rng.standard_normal((2, 2, 5, 3)), requires_grad=True) for _ in range(3))
    before = [x.detach().clone() for x in (q, k, v)]
    versions = [x._version for x in (q, k, v)]
    out, w = at.attention(q, k, v, causal=True, need_weights=True, backend=backend)
    (out.sum() + w.sum()).backward()
    for x, b in zip((q, k, v), before):
        assert torch.equal(x.detach(), b)
    assert versions == [x._version for x in (q, k, v)]
    assert torch.all(w.triu(1) == 0)


def test_empty_lengths():
    q = torch.randn(1, 2, 3, 4)
    out, w = at.attention(q, torch.randn(1, 2, 0, 4), torch.randn(1, 2, 0, 5), need_weights=True)
    assert out.shape == (1, 2, 3, 5) and torch.all(out == 0) and w.shape == (1, 2, 3, 0)
    out, _ = at.attention(torch.randn(1, 2, 0, 4), torch.randn(1, 2, 3, 4), torch.randn(1, 2, 3, 5))
    assert out.shape == (1, 2, 0, 5)


def test_dropout_only_in_training_and_unbiased():
    torch.manual_seed(0)
    q, k = torch.randn(4, 2, 64, 8), torch.randn(4, 2, 64, 8)
    v = torch.ones(4, 2, 64, 1)
    for backend in BACKENDS:
        out, w = at.attention(q, k, v, dropout_p=0.5, training=False, need_weights=True,
                              backend=backend)
        torch.testing.assert_close(out, torch.ones_like(out))  # no dropout in eval
        out, w = at.attention(q, k, v, dropout_p=0.5, training=True, need_weights=True,
                              backend=backend)
        assert not torch.allclose(out, torch.ones_like(out))  # dropout happened
        torch.testing.assert_close(w.sum(-1), torch.ones(4, 2, 64))  # weights pre-dropout
        # E[dropped weights / (1-p)] sums to 1 per row: the mean over 512 rows is near 1.
        assert abs(out.mean().item() - 1.0) < 0.05


def test_triton_path_not_taken_on_cpu(monkeypatch):
    """Without attnkit.triton, or on CPU tensors, auto never reaches for it; forcing it says
    why it cannot."""
    calls = []
    fake = types.ModuleType("attnkit.triton")
    fake.is_available = lambda: True
    fake.flash_attention = lambda *a, **k: calls.append(1)
    monkeypatch.setitem(sys.modules, "attnkit.triton", fake)
    # `import attnkit.triton as x` reads the package attribute when the real one is loaded
    monkeypatch.setattr(attnkit, "triton", fake, raising=False)
    q = torch.randn(1, 2, 4, 8, dtype=torch.bfloat16)
    out, _ = at.attention(q, q, q, causal=True)
    assert calls == [] and out.shape == q.shape
    with pytest.raises(ValueError, match="needs CUDA"):
        at.attention(q, q, q, backend="triton")


def test_triton_dispatch_conditions(monkeypatch):
    """The dispatcher would hand a CUDA half-precision call with no mask to the kernel, and
    nothing else (checked on the decision function, since there is no GPU here)."""
    from attnkit.torch import _triton_path as tp

    fake = types.ModuleType("attnkit.triton")
    fake.is_available = lambda: True
    monkeypatch.setitem(sys.modules, "attnkit.triton", fake)
    # `import attnkit.triton as x` reads the package attribute when the real one is loaded
    monkeypatch.setattr(attnkit, "triton", fake, raising=False)
    q = (1, 2, 4, 8)

    def reason(q=q, k=q, Dv=8, dtype=torch.float16, mask=False, bias=False, drop=False,
               device="cuda"):
        return tp.triton_reason(device, dtype, q, k, Dv, mask, bias, drop)

    assert reason() is None
    assert "needs CUDA" in reason(device="cpu")
    assert "mask" in reason(mask=True) and "mask" in reason(bias=True)
    assert "dropout" in reason(drop=True)
    assert "float16/bfloat16" in reason(dtype=torch.float32)
    assert "broadcast batch" in reason(k=(2, 2, 4, 8))
    assert "head dims 1..256" in reason(q=(1, 2, 4, 512), k=(1, 2, 4, 512), Dv=512)
    monkeypatch.setitem(sys.modules, "attnkit.triton", None)  # not importable
    monkeypatch.delattr(attnkit, "triton", raising=False)
    assert "not importable" in reason()


ERRORS = [
    ((2, 3, 4, 5), (2, 3, 6, 7), (2, 3, 6, 7), {}, ValueError, r"Dk.*\(2, 3, 4, 5\)"),
    ((2, 3, 4, 5), (2, 3, 6, 5), (2, 3, 7, 5), {}, ValueError, r"k \(2, 3, 6, 5\), v \(2, 3, 7"),
    ((2, 4, 4, 5), (2, 3, 6, 5), (2, 3, 6, 5), {}, ValueError, r"H=4.*Hkv=3"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"valid_lens": torch.tensor([1, 2, 3])},
     ValueError, r"valid_lens of shape \(3,\)"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"valid_lens": torch.tensor([1, 7])},
     ValueError, r"\[0, 6\]"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5),
     {"mask": torch.ones(3, 1, 4, 6, dtype=torch.bool)}, ValueError,
     r"\(3, 1, 4, 6\).*\(2, 2, 4, 6\)"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"mask": torch.ones(4, 6)}, TypeError, "bool"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"bias": torch.ones(4, 5)}, ValueError,
     r"bias of shape \(4, 5\)"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"window": 3}, TypeError, "window"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"backend": "cudnn"}, ValueError, "backend"),
    ((2, 2, 4, 5), (2, 2, 6, 5), (2, 2, 6, 5), {"dropout_p": 1.0}, ValueError, "dropout_p"),
    ((4, 5), (2, 6, 5), (2, 6, 5), {}, ValueError, "same number of dims"),
    # A mask of lower rank is named as the caller passed it, not as broadcast internally.
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"mask": torch.ones(5, 6, dtype=torch.bool)},
     ValueError, r"mask of shape \(5, 6\) is not broadcastable to scores \(2, 4, 5, 7\)"),
    ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"mask": torch.ones(6, dtype=torch.bool)},
     ValueError, r"mask of shape \(6,\) is not"),
]


@pytest.mark.parametrize("qs, ks, vs, kw, exc, pattern", ERRORS)
def test_errors_name_shapes(qs, ks, vs, kw, exc, pattern):
    with pytest.raises(exc, match=pattern):
        at.attention(torch.randn(qs), torch.randn(ks), torch.randn(vs), **kw)


def test_integer_inputs_rejected():
    x = torch.ones(1, 2, 3, dtype=torch.long)
    with pytest.raises(TypeError, match="floating-point"):
        at.attention(x, x, x)


@pytest.mark.skipif(
    importlib.util.find_spec("triton") is None,
    reason="needs the triton extra (the kernels run under TRITON_INTERPRET=1 on the CPU)",
)
def test_triton_hand_off_matches_math_path(monkeypatch):
    """With the real kernels: on a GPU in float16; on CPU under TRITON_INTERPRET=1 in
    float32 (the dispatcher's CUDA/half check is bypassed there, the call is unchanged)."""
    if torch.cuda.is_available():
        device, dtype, tol = "cuda", torch.float16, 2e-3
    else:
        from attnkit.torch import _signature

        monkeypatch.setenv("TRITON_INTERPRET", "1")  # read when the kernels first load
        # The dispatch decision is kept per call signature: start from an empty table.
        monkeypatch.setattr(_signature, "_PREPARED", {})
        monkeypatch.setattr(_signature, "triton_reason", lambda *a: None)
        device, dtype, tol = "cpu", torch.float32, 1e-5
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 16, generator=g).to(device, dtype)
    k = torch.randn(1, 2, 7, 16, generator=g).to(device, dtype)
    v = torch.randn(1, 2, 7, 16, generator=g).to(device, dtype)
    for causal, window in ((False, None), (True, None), (False, (2, 1))):
        out, w = at.attention(q, k, v, causal=causal, window=window, need_weights=True,
                              backend="triton")
        ref, ref_w = at.attention(q, k, v, causal=causal, window=window, need_weights=True,
                                  backend="math")
        torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
        torch.testing.assert_close(w, ref_w, rtol=tol, atol=tol)


# -- the plan: a pure function of the call's structure -------------------------------------


def _call(**given):
    """A :class:`attnkit.torch.functional.Call` for q, k, v (2, 4, 8, 16) on the CPU, with
    the fields given overriding."""
    from attnkit.torch.functional import Call

    base = dict(backend="auto", device="cpu", triton="needs CUDA", q_shape=(2, 4, 8, 16),
                Dv=16, scores=(2, 4, 8, 8), masked=False, bias=False, causal=None, window=None,
                segment_ids=False, packed=False, softcap=False, sinks=False, dropout=False,
                need_weights=False, grad=False)
    return Call(**{**base, **given})


@pytest.mark.parametrize("given, path, is_causal, band, empty", [
    ({}, "sdpa", False, False, False),
    ({"causal": "bottom_right"}, "sdpa", True, False, False),  # Tq == Tk: SDPA's own
    ({"causal": "top_left", "scores": (2, 4, 3, 8)}, "sdpa", True, False, False),
    ({"causal": "bottom_right", "scores": (2, 4, 3, 8)}, "sdpa", False, True, False),
    ({"causal": "bottom_right", "scores": (2, 4, 1, 8)}, "sdpa", False, False, False),  # decode
    ({"causal": "bottom_right", "bias": True}, "sdpa", False, True, True),  # T5: one mask
    ({"causal": "bottom_right", "scores": (2, 4, 8, 3)}, "sdpa", False, True, True),
    ({"window": (2, 0)}, "sdpa", False, True, False),
    ({"masked": True}, "sdpa", False, False, True),
    ({"softcap": True}, "math", False, False, False),
    ({"need_weights": True}, "math", False, False, False),
    ({"need_weights": True, "grad": True, "scores": (64, 64, 64, 64)}, "sdpa", False, False,
     False),
    ({"backend": "math", "causal": "bottom_right"}, "math", False, True, False),
    ({"scores": (2, 4, 8, 0)}, "math", False, False, True),
    ({"segment_ids": True, "packed": True}, "packed", False, False, True),
    ({"triton": None, "device": "cuda", "segment_ids": True}, "triton", False, False, True),
])
def test_plan_picks_the_path_from_the_structure_alone(given, path, is_causal, band, empty):
    from attnkit.torch.functional import plan

    got = plan(_call(**given))
    assert (got.path, got.is_causal, got.band, got.empty_rows) == (path, is_causal, band, empty)


def test_plan_refuses_a_forced_path_that_cannot_take_the_call():
    from attnkit.torch.functional import may_pack, plan

    with pytest.raises(ValueError, match="backend='triton' cannot take this call: needs CUDA"):
        plan(_call(backend="triton"))
    with pytest.raises(ValueError, match="backend='sdpa' cannot take softcap"):
        plan(_call(backend="sdpa", softcap=True))
    # Packed runs are never looked for in a decoding step, nor beside another mask.
    assert may_pack(_call(segment_ids=True))
    assert not may_pack(_call(segment_ids=True, scores=(2, 4, 1, 8)))
    assert not may_pack(_call(segment_ids=True, masked=True))


@pytest.mark.parametrize("T", [9, 33])
def test_bias_with_causal_trains_on_every_path(T):
    """Bug (issue 22, T5 training): a bias that needs a gradient with causal=True sent SDPA
    both an attn_mask and is_causal, which it refuses. The band now goes into the mask."""
    g = torch.Generator().manual_seed(T)
    q = torch.randn(1, 4, T, 16, generator=g, dtype=torch.float64)
    b = torch.randn(1, 4, T, T, generator=g, dtype=torch.float64, requires_grad=True)
    grads = []
    for backend in ("auto", "sdpa", "math"):
        out, _ = at.attention(q, q, q, bias=b, causal=True, backend=backend)
        grads.append((out, torch.autograd.grad(out.sum(), b)[0]))
    ref = reference_attention(q, q, q, bias=b.detach(), causal=True)
    for out, grad in grads:
        np.testing.assert_allclose(npy(out), ref.out, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad, grads[-1][1])
        assert (grad[..., torch.ones(T, T, dtype=torch.bool).triu(1)] == 0).all()
