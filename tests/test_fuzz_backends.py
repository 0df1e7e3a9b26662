"""Every CPU backend against the float64 reference, fuzzed (issue 16).

Hypothesis draws a problem (batch, query and key/value heads, lengths, head dims), a dtype
and a combination of constraints (mask, valid_lens, causal, window, scale, softcap); each
backend takes the constraints it has and is judged by the DESIGN.md rule
(``attnkit.testing.assert_close_by_rule``): its max error against
``attnkit.testing.reference_attention`` in float64, on the same (rounded) inputs, is at most
2x (out, LSE) / 5x (dq) / 3x (dk, dv) that of plain PyTorch math in the same dtype, plus
1e-5. Backends: NumPy SDPA and flash (through ``vjp``), torch ``attention`` with
``backend="math"``, ``"sdpa"`` and ``"auto"``, the ring's block op
(``attnkit.torch.attention_with_lse`` and its backward), and the Triton kernels in the
interpreter at tiny sizes.

Sizes and ``max_examples`` keep the whole file under a minute on a 2-core CI box;
``derandomize=True`` makes CI runs repeatable. Also here: the shared scale and window rules
(``attnkit.spec``) on every backend.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import attnkit.numpy as an
from attnkit.testing import (
    assert_close_by_rule,
    band_keep,
    lengths_keep,
    reference_attention,
)

torch = pytest.importorskip("torch")
import attnkit.torch as at  # noqa: E402
from attnkit.torch.lse import attention_with_lse, attention_with_lse_backward  # noqa: E402

FUZZ = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
FACTORS = {"out": 2, "lse": 2, "dq": 5, "dk": 3, "dv": 3}
TORCH_DTYPES = {"float64": torch.float64, "float32": torch.float32,
                "float16": torch.float16, "bfloat16": torch.bfloat16}


@st.composite
def problems(draw, dtypes, max_t=12):
    """A problem: shapes, dtype, constraints and a seed for the data."""
    B, Hkv, G = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.sampled_from([1, 2]))
    Tq, Tk = draw(st.integers(1, max_t)), draw(st.integers(1, max_t))
    side = st.one_of(st.none(), st.integers(-3, 6))
    vl_kind = draw(st.sampled_from([None, "per_batch", "per_query"]))
    valid_lens = None
    if vl_kind == "per_batch":
        valid_lens = draw(st.lists(st.integers(0, Tk), min_size=B, max_size=B))
    elif vl_kind == "per_query":
        valid_lens = [draw(st.lists(st.integers(0, Tk), min_size=Tq, max_size=Tq))
                      for _ in range(B)]
    return dict(
        B=B, Hkv=Hkv, H=Hkv * G, Tq=Tq, Tk=Tk,
        Dk=draw(st.sampled_from([1, 3, 8, 16])), Dv=draw(st.sampled_from([1, 4, 8])),
        dtype=draw(st.sampled_from(dtypes)),
        causal=draw(st.booleans()),
        window=draw(st.one_of(st.none(), st.tuples(side, side))),
        mask=draw(st.sampled_from([None, 0.3, 0.8])),  # probability of True (may attend)
        valid_lens=valid_lens,
        scale=draw(st.sampled_from([None, 0.25, 1.3])),
        softcap=draw(st.sampled_from([None, 0.5, 30.0])),
        seed=draw(st.integers(0, 2**16)),
    )


def _data(p: dict) -> dict[str, Any]:
    """float64 arrays rounded to the problem's dtype (the reference sees the same numbers)."""
    g = np.random.default_rng(p["seed"])
    B, H, Hkv, Tq, Tk, Dk, Dv = (p[n] for n in ("B", "H", "Hkv", "Tq", "Tk", "Dk", "Dv"))
    arrays = {"q": g.standard_normal((B, H, Tq, Dk)), "k": g.standard_normal((B, Hkv, Tk, Dk)),
              "v": g.standard_normal((B, Hkv, Tk, Dv)), "dout": g.standard_normal((B, H, Tq, Dv))}
    dt = TORCH_DTYPES[p["dtype"]]
    data = {n: torch.from_numpy(x).to(dt).double().numpy() for n, x in arrays.items()}
    data["mask"] = None if p["mask"] is None else g.random((B, 1, Tq, Tk)) < p["mask"]
    data["valid_lens"] = None if p["valid_lens"] is None else np.asarray(p["valid_lens"])
    return data


def _options(p: dict, data: dict, takes: tuple[str, ...]) -> dict[str, Any]:
    opts = {"causal": p["causal"], "window": p["window"], "scale": p["scale"],
            "softcap": p["softcap"], "mask": data["mask"], "valid_lens": data["valid_lens"]}
    return {n: v for n, v in opts.items() if n in takes and v is not None}


def _plain(data: dict, opts: dict, dtype) -> dict[str, Any]:
    """Plain PyTorch math in ``dtype`` with autograd: the baseline of the rule."""
    q, k, v = (torch.from_numpy(data[n]).to(dtype).requires_grad_(True) for n in "qkv")
    B, H, Tq, Dk = q.shape
    G = H // k.shape[1]
    kk, vv = k.repeat_interleave(G, 1), v.repeat_interleave(G, 1)
    scale = 1.0 / math.sqrt(Dk) if opts.get("scale") is None else opts["scale"]
    s = (q @ kk.transpose(-1, -2)) * scale
    if opts.get("softcap") is not None:
        s = opts["softcap"] * torch.tanh(s / opts["softcap"])
    Tk = k.shape[2]
    keep = np.broadcast_to(band_keep(Tq, Tk, opts.get("causal", False), opts.get("window")),
                           (B, H, Tq, Tk)).copy()
    if opts.get("mask") is not None:
        keep &= np.broadcast_to(opts["mask"], keep.shape)
    if opts.get("valid_lens") is not None:
        keep &= lengths_keep(opts["valid_lens"], (B, H), Tq, Tk)
    keep = torch.from_numpy(keep)
    any_row = keep.any(-1, keepdim=True)
    zero = torch.zeros((), dtype=dtype)
    s = torch.where(any_row, torch.where(keep, s, -math.inf), zero)
    w = torch.where(keep, torch.softmax(s, -1), zero)
    out = w @ vv
    lse = torch.where(any_row[..., 0], torch.logsumexp(s, -1), -math.inf)
    out.backward(torch.from_numpy(data["dout"]).to(dtype))
    return {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _judge(got: dict, data: dict, opts: dict, dtype) -> None:
    ref = reference_attention(data["q"], data["k"], data["v"], d_out=data["dout"], **opts)
    base = _plain(data, opts, dtype)
    for name, value in got.items():
        assert_close_by_rule(value, getattr(ref, name), base[name], factor=FACTORS[name],
                             name=name)


# -- the backends ------------------------------------------------------------------------

_NP = {"float64": np.float64, "float32": np.float32, "float16": np.float16}


def _numpy_sdpa(data, opts, dtype_name):
    q, k, v = (data[n].astype(_NP[dtype_name]) for n in "qkv")
    (out, _), back = an.vjp(an.scaled_dot_product_attention, q, k, v, **opts)
    dq, dk, dv = back(data["dout"].astype(_NP[dtype_name]))
    return {"out": out, "dq": dq, "dk": dk, "dv": dv}


def _numpy_flash(data, opts, dtype_name):
    q, k, v = (data[n].astype(_NP[dtype_name]) for n in "qkv")
    (out, lse), back = an.vjp(an.flash_attention, q, k, v, return_lse=True, block_q=4,
                              block_k=8, **opts)
    dq, dk, dv = back(data["dout"].astype(_NP[dtype_name]))
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _torch(backend):
    def run(data, opts, dtype_name):
        dt = TORCH_DTYPES[dtype_name]
        q, k, v = (torch.from_numpy(data[n]).to(dt).requires_grad_(True) for n in "qkv")
        kw = dict(opts)
        if "mask" in kw:
            kw["mask"] = torch.from_numpy(kw["mask"])
        if "valid_lens" in kw:
            kw["valid_lens"] = torch.from_numpy(kw["valid_lens"])
        out, _ = at.attention(q, k, v, backend=backend, **kw)
        out.backward(torch.from_numpy(data["dout"]).to(dt))
        assert out.dtype == dt
        return {"out": out, "dq": q.grad, "dk": k.grad, "dv": v.grad}

    return run


def _lse_op(data, opts, dtype_name):
    dt = TORCH_DTYPES[dtype_name]
    q, k, v, dout = (torch.from_numpy(data[n]).to(dt) for n in ("q", "k", "v", "dout"))
    Tk = k.shape[2]
    key_mask = None
    if "valid_lens" in opts:
        key_mask = torch.arange(Tk)[None, :] < torch.from_numpy(opts["valid_lens"])[:, None]
    scale = opts.get("scale", 1.0 / math.sqrt(q.shape[-1]))
    kw = dict(causal=opts.get("causal", False), scale=scale, key_mask=key_mask)
    out, lse = attention_with_lse(q, k, v, lse_dtype=torch.float64, **kw)
    dq, dk, dv = attention_with_lse_backward(dout, q, k, v, out, lse, **kw)
    return {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}


def _triton(data, opts, dtype_name):
    import attnkit.triton as tt

    dt = TORCH_DTYPES[dtype_name]
    q, k, v = (torch.from_numpy(data[n]).to(dt).requires_grad_(True) for n in "qkv")
    out, lse = tt.flash_attention(q, k, v, return_lse=True, **opts)
    out.backward(torch.from_numpy(data["dout"]).to(dt))
    return {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


_ALL = ("mask", "valid_lens", "causal", "window", "scale")
BACKENDS = {  # name: (run, dtypes, options it takes)
    "numpy_sdpa": (_numpy_sdpa, ["float64", "float32", "float16"], _ALL),
    "numpy_flash": (_numpy_flash, ["float64", "float32", "float16"],
                    ("causal", "window", "scale")),
    "torch_math": (_torch("math"), list(TORCH_DTYPES), _ALL),
    "torch_sdpa": (_torch("sdpa"), list(TORCH_DTYPES), _ALL),
    "torch_auto": (_torch("auto"), list(TORCH_DTYPES), _ALL),
    "torch_lse_op": (_lse_op, list(TORCH_DTYPES), ("causal", "scale", "valid_lens")),
}


def _fuzz(name: str, p: dict) -> None:
    run, _, takes = BACKENDS[name]
    if name == "torch_lse_op" and p["valid_lens"] is not None and np.ndim(p["valid_lens"]) > 1:
        p = {**p, "valid_lens": None}  # the block op takes per-key lengths only
    data = _data(p)
    opts = _options(p, data, takes)
    _judge(run(data, opts, p["dtype"]), data, opts, TORCH_DTYPES[p["dtype"]])


@pytest.mark.parametrize("name", list(BACKENDS))
def test_backend_follows_the_rule(name):
    @FUZZ
    @given(p=problems(BACKENDS[name][1]))
    def check(p):
        _fuzz(name, p)

    check()


def test_triton_interpreter_follows_the_rule():
    pytest.importorskip("triton")
    if torch.cuda.is_available():
        pytest.skip("the GPU runs tests/triton at full size; this fuzz is for the interpreter")

    @settings(FUZZ, max_examples=15)
    @given(p=problems(["float32", "float16"], max_t=10))
    def check(p):
        data = _data(p)
        opts = _options(p, data, ("causal", "window", "scale", "softcap"))
        _judge(_triton(data, opts, p["dtype"]), data, opts, TORCH_DTYPES[p["dtype"]])

    check()


# -- the shared rules, on every backend ----------------------------------------------------


def _calls(scale=None, window=None):
    """One call per backend with these options (small float32 problem)."""
    import attnkit.triton as tt
    from attnkit.distributed import ring_attention

    g = np.random.default_rng(0)
    q = g.standard_normal((1, 2, 4, 16)).astype(np.float32)
    t = torch.from_numpy(q)
    kw = {} if window is None else {"window": window}
    return {
        "numpy_sdpa": lambda: an.scaled_dot_product_attention(q, q, q, scale=scale, **kw),
        "numpy_flash": lambda: an.flash_attention(q, q, q, scale=scale, **kw),
        "torch_math": lambda: at.attention(t, t, t, scale=scale, backend="math", **kw),
        "torch_sdpa": lambda: at.attention(t, t, t, scale=scale, backend="sdpa", **kw),
        "triton_flash": lambda: tt.flash_attention(t, t, t, scale=scale, **kw),
        "triton_decode": lambda: tt.decode_attention(t[:, :, :1], t, t, 4, scale=scale),
        "ring": lambda: ring_attention(t, t, t, scale=scale),
        "lse_op": lambda: attention_with_lse(t, t, t, causal=False, scale=scale),
    }


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, np.float32("nan")], ids=str)
@pytest.mark.parametrize("backend", list(_calls()))
def test_every_backend_rejects_a_non_finite_scale(backend, bad):
    pytest.importorskip("triton")
    call = _calls(scale=bad)[backend]
    with pytest.raises(ValueError, match="scale must be finite"):
        call()


@pytest.mark.parametrize("backend", ["numpy_sdpa", "numpy_flash", "torch_math", "torch_sdpa",
                                     "triton_flash"])
def test_every_backend_takes_numpy_integer_window_sides(backend):
    pytest.importorskip("triton")
    plain = _calls(window=(1, 0))[backend]()
    numpy_ints = _calls(window=(np.int64(1), np.int32(0)))[backend]()
    a = plain[0] if isinstance(plain, tuple) else plain
    b = numpy_ints[0] if isinstance(numpy_ints, tuple) else numpy_ints
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
