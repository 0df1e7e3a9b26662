"""``check_model`` on any PyTorch model: the look-alikes of ``lookalikes.py`` (a nanoGPT-style
GPT, a ViT encoder, an encoder-decoder with cross-attention and a KV cache, a model on
``nn.MultiheadAttention``) are judged call by call with no finding when correct, in
float32, bfloat16 and float16; a fault planted in one layer (a ``-1e9`` fill in float16, a
dropped scale) is found at that layer, and its reproducer runs as printed and fails."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lookalikes as L  # noqa: E402

from attnkit.check import check_model  # noqa: E402

DTYPES = ("float32", "bfloat16", "float16")

# model -> (build, inputs, the layers it has, the layer a fault is planted in)
GPT_LAYERS = ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]
VIT_LAYERS = ["blocks.0.attn", "blocks.1.attn"]
S2S_LAYERS = ["encoder.0.self_attn", "encoder.1.self_attn", "decoder.0.self_attn",
              "decoder.0.cross_attn", "decoder.1.self_attn", "decoder.1.cross_attn"]
MHA_LAYERS = ["encoder.0.self_attn", "encoder.1.self_attn", "causal"]


def build(kind: str, dtype: str, planted: dict | None = None) -> tuple:
    """``(model, inputs)`` seeded, in ``dtype``."""
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    if kind == "gpt":
        return L.GPT().to(dt), (L.tokens(),)
    if kind == "vit":
        return L.ViT().to(dt), (torch.randn(2, 3, 16, 16).to(dt),)
    if kind == "seq2seq":
        return L.Seq2Seq().to(dt), (L.tokens(), L.padded(), L.tokens(length=3, seed=1))
    mha = L.HandMHA(L.WIDTH, L.HEADS, **planted) if planted is not None else None
    return L.MHAModel(planted=mha).to(dt), (L.tokens(), ~L.padded())


LAYERS = {"gpt": GPT_LAYERS, "vit": VIT_LAYERS, "seq2seq": S2S_LAYERS, "mha": MHA_LAYERS}
PLANTED_AT = {"gpt": "blocks.1.attn", "vit": "blocks.1.attn", "seq2seq": "decoder.1.cross_attn",
              "mha": "causal"}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", list(LAYERS))
def test_lookalikes_are_clean(kind: str, dtype: str) -> None:
    model, inputs = build(kind, dtype)
    report = check_model(model, inputs)
    r = report.implementations[0]
    assert report.ok and report.codes == [], report.text()
    assert r.status == "ran", r.status
    assert [row.layer for row in r.layers] == LAYERS[kind], report.text()
    for row in r.layers:
        assert row.verdict == "ok" and row.calls >= 1 and 0 < row.worst_error <= row.bound, row
    if kind == "seq2seq":  # the prefill and two decoding steps with the KV cache
        assert {row.layer: row.calls for row in r.layers}["decoder.1.self_attn"] == 3


@pytest.mark.parametrize("dtype", ("float32", "float16"))
def test_a_correct_hand_written_sdpa_in_every_layer_is_clean(dtype: str) -> None:
    model, inputs = build("seq2seq", dtype)
    report = check_model(model, inputs, implementation=L.plain_attention)
    assert report.ok and report.codes == [], report.text()
    assert report.implementations[0].name == "plain_attention"


def _planted(kind: str, fault: str) -> tuple:
    dtype = "float16" if fault == "fill" else "float32"
    if kind == "mha":
        planted = {"fill": -1e9} if fault == "fill" else {"scaled": False}
        model, inputs = build(kind, dtype, planted)
        return model, inputs, None
    fn = L.fill_minus_1e9 if fault == "fill" else L.unscaled
    model, inputs = build(kind, dtype)
    return model, inputs, {PLANTED_AT[kind]: fn}


def _run_reproducer(text: str, tmp_path: Path) -> subprocess.CompletedProcess:
    script = tmp_path / "repro.py"
    script.write_text(text + "\n")
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=120)


@pytest.mark.parametrize("fault", ("fill", "scale"))
@pytest.mark.parametrize("kind", list(LAYERS))
def test_a_fault_in_one_layer_is_found_at_that_layer(kind: str, fault: str,
                                                     tmp_path: Path) -> None:
    model, inputs, implementation = _planted(kind, fault)
    report = check_model(model, inputs, implementation=implementation, save_to=tmp_path)
    r = report.implementations[0]
    code = "float16-overflow" if fault == "fill" else "wrong-scale"
    assert not report.ok and report.codes == [code], report.text()
    at = PLANTED_AT[kind]
    assert r.first_failing_layer == at and r.findings[0].layer == at, report.text()
    rows = {row.layer: row for row in r.layers}
    assert rows[at].verdict == code
    after = LAYERS[kind][LAYERS[kind].index(at) + 1:]
    assert all(row.verdict == "ok" for n, row in rows.items() if n not in after + [at])
    if fault == "fill":  # the layers after the one that raised did not run: named so
        assert r.status.startswith("stopped: an attention call raised RuntimeError"), r.status
        for n in after:
            assert rows[n].verdict == "not checked" and "stopped" in rows[n].note, rows[n]
    reproducer = r.findings[0].reproducer
    assert reproducer and "..." not in reproducer, reproducer
    why = "RuntimeError: value cannot be converted" if fault == "fill" else \
        f"AssertionError: {code}"
    if (kind, fault) in (("gpt", "scale"), ("mha", "fill")):
        # as printed, in a fresh interpreter, from another folder
        done = _run_reproducer(reproducer, tmp_path)
        assert done.returncode != 0 and why in done.stderr, done.stderr[-400:]
    else:
        with pytest.raises(RuntimeError if fault == "fill" else AssertionError,
                           match="value cannot be converted" if fault == "fill" else code):
            exec(compile(reproducer, "<reproducer>", "exec"), {})
    if kind in ("gpt", "mha"):  # the same lines with the fault taken out pass
        fixed = reproducer.replace("lookalikes.py:unscaled", "lookalikes.py:plain_attention")
        fixed = fixed.replace("lookalikes.py:fill_minus_1e9", "lookalikes.py:plain_attention")
        if kind == "mha":
            fixed = fixed.replace("m = m.to(", "m.fill, m.scaled = float('-inf'), True\nm = m.to(")
        assert fixed != reproducer
        exec(compile(fixed, "<fixed reproducer>", "exec"), {})


@pytest.mark.parametrize("dtype", DTYPES)
def test_flex_attention_calls_are_judged_with_their_mask_and_score_mods(dtype: str) -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    torch.manual_seed(0)
    model = L.FlexModel().to(getattr(torch, dtype))
    report = check_model(model, (L.tokens(),))
    r = report.implementations[0]
    assert report.ok and r.status == "ran", report.text()
    assert [(row.layer, row.calls, row.verdict) for row in r.layers] == \
        [("layers.0", 1, "ok"), ("layers.1", 1, "ok")]


def test_a_flex_output_that_is_not_what_its_mods_compute_is_found() -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    from attnkit.check.model.any_model import judge_call
    from attnkit.check.model.torch_calls import CallRecorder

    torch.manual_seed(0)
    model, codes = L.FlexModel(layers=1), []

    def on_call(call) -> None:
        codes.append(judge_call(call).code)
        call.output = call.output.flip(-2)  # the rows of another query
        codes.append(judge_call(call).code)

    with torch.no_grad(), CallRecorder(model, on_call):
        model(L.tokens())
    assert codes == [None, "inaccurate"]


class _Wrapped(torch.nn.Module):
    def __init__(self, **kw) -> None:
        super().__init__()
        self.mha = torch.nn.MultiheadAttention(16, 4, **kw)

    def forward(self, q, k, v, **call):
        return self.mha(q, k, v, **call)[0]


_PAD = torch.tensor([[False] * 7, [False] * 4 + [True] * 3])
MHA_CASES = {  # name: (constructor keywords, call keywords)
    "sequence-first": ({}, {}),
    "kdim-vdim": ({"kdim": 8, "vdim": 12}, {}),
    "bias-kv-zero-attn": ({"add_bias_kv": True, "add_zero_attn": True},
                          {"key_padding_mask": _PAD}),
    "no-bias": ({"bias": False}, {}),
    "float-attn-mask": ({}, {"attn_mask": torch.randn(5, 7)}),
    "per-head-bool-mask": ({}, {"attn_mask": torch.rand(8, 5, 7) > 0.3}),  # some rows empty
    "float-padding": ({}, {"key_padding_mask": torch.zeros(2, 7).masked_fill(_PAD, -math.inf)}),
    "causal-sdpa-path": ({}, {"need_weights": False,
                              "attn_mask": torch.ones(5, 7, dtype=torch.bool).triu(1)}),
}


@pytest.mark.parametrize("dtype", ("float32", "float16"))
@pytest.mark.parametrize("case", list(MHA_CASES))
def test_nn_multihead_attention_is_judged_from_its_weights_in_every_setting(case: str,
                                                                           dtype: str) -> None:
    kw, call = MHA_CASES[case]
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    model = _Wrapped(batch_first=True, **kw).to(dt)
    q, k, v = (torch.randn(2, n, d).to(dt) for n, d in
               ((5, 16), (7, kw.get("kdim", 16)), (7, kw.get("vdim", 16))))
    call = {n: x.to(dt) if x.is_floating_point() else x for n, x in call.items()
            if isinstance(x, torch.Tensor)} | {n: x for n, x in call.items()
                                                if not isinstance(x, torch.Tensor)}
    report = check_model(model, {"q": q, "k": k, "v": v, **call})
    rows = report.implementations[0].layers
    assert report.ok and [(r.layer, r.calls, r.verdict) for r in rows] == [("mha", 1, "ok")], \
        report.text()
    assert 0 < rows[0].worst_error <= rows[0].bound


class _SDPA(torch.nn.Module):
    def forward(self, q, k, v, **kw):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


_KEEP = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]
SDPA_CASES = {  # name: (q, k, v shapes, keywords)
    "plain": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {}),
    "three-dims": ((4, 5, 8), (4, 7, 8), (4, 7, 8), {}),
    "gqa": ((2, 4, 5, 8), (2, 2, 7, 8), (2, 2, 7, 8), {"enable_gqa": True}),
    "causal": ((2, 4, 7, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"is_causal": True}),
    "causal-top-left": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"is_causal": True}),
    "bool-padding": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"attn_mask": _KEEP}),
    "float-mask": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8), {"attn_mask": torch.randn(5, 7)}),
    "inf-mask": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 8),
                 {"attn_mask": torch.zeros(2, 1, 5, 7).masked_fill(~_KEEP, -math.inf)}),
    "scale-and-value-width": ((2, 4, 5, 8), (2, 4, 7, 8), (2, 4, 7, 12), {"scale": 0.05}),
    "causal-as-mask": ((2, 4, 7, 8), (2, 4, 7, 8), (2, 4, 7, 8),
                       {"attn_mask": torch.ones(7, 7, dtype=torch.bool).tril()}),
}


def _sdpa_inputs(case: str, dtype: str) -> dict:
    qs, ks, vs, kw = SDPA_CASES[case]
    dt = getattr(torch, dtype)
    torch.manual_seed(0)
    q, k, v = (torch.randn(*s).to(dt) for s in (qs, ks, vs))
    kw = {n: x.to(dt) if isinstance(x, torch.Tensor) and x.is_floating_point() else x
          for n, x in kw.items()}
    return {"q": q, "k": k, "v": v, **kw}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", list(SDPA_CASES))
def test_torch_sdpa_is_clean_in_every_setting(case: str, dtype: str) -> None:
    report = check_model(_SDPA(), _sdpa_inputs(case, dtype))
    rows = report.implementations[0].layers
    assert report.ok and [(r.layer, r.calls, r.verdict) for r in rows] == \
        [("(model)", 1, "ok")], report.text()


def _ignores_causal(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None, enable_gqa=False):
    return L.plain_attention(query, key, value, attn_mask, scale=scale)


def _inverted_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                   scale=None, enable_gqa=False):
    return L.plain_attention(query, key, value, ~attn_mask, is_causal=is_causal, scale=scale)


def _ignores_mask(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
    return L.plain_attention(query, key, value, None, is_causal=is_causal, scale=scale)


def _bottom_right(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
    L_, S = query.shape[-2], key.shape[-2]
    keep = torch.ones(L_, S, dtype=torch.bool).tril(S - L_)
    return L.plain_attention(query, key, value, keep, scale=scale)


@pytest.mark.parametrize("fn, case, code", [
    (_ignores_causal, "causal", "causal-leak"),
    (_inverted_mask, "bool-padding", "mask-polarity"),
    (_ignores_mask, "bool-padding", "padding-ignored"),
    (_ignores_mask, "causal-as-mask", "causal-leak"),
    (_bottom_right, "causal-top-left", "causal-alignment"),
])
def test_common_kernel_bugs_get_their_own_code(fn, case: str, code: str) -> None:
    report = check_model(_SDPA(), _sdpa_inputs(case, "float32"), implementation=fn)
    assert report.codes == [code] and not report.ok, report.text()
    assert report.implementations[0].layers[0].verdict == code


def _scales_query_in_place(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                           scale=None, enable_gqa=False):
    query.mul_(1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)
    return L.plain_attention(query, key, value, attn_mask, is_causal=is_causal, scale=1.0)


def test_a_function_that_writes_into_its_arguments_is_mutates_input() -> None:
    report = check_model(_SDPA(), _sdpa_inputs("causal", "float32"),
                         implementation=_scales_query_in_place)
    assert report.codes == ["mutates-input"] and not report.ok, report.text()
    assert "query" in report.implementations[0].findings[0].message


@pytest.mark.parametrize("dtype", ("float32", "float16"))
def test_torch_nn_transformer_with_padding_is_clean_and_every_attention_judged(dtype) -> None:
    torch.manual_seed(0)
    dt = getattr(torch, dtype)
    model = torch.nn.Transformer(d_model=32, nhead=4, num_encoder_layers=2,
                                 num_decoder_layers=2, dim_feedforward=64, dropout=0.0,
                                 batch_first=True).to(dt)
    pad = torch.zeros(2, 9, dtype=torch.bool)
    pad[1, 6:] = True
    inputs = {"src": torch.randn(2, 9, 32).to(dt), "tgt": torch.randn(2, 6, 32).to(dt),
              "tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(6, dtype=dt),
              "src_key_padding_mask": pad, "memory_key_padding_mask": pad}
    report = check_model(model, inputs)
    assert report.ok, report.text()
    assert [(r.layer, r.calls, r.verdict) for r in report.implementations[0].layers] == [
        (f"{side}.layers.{i}.{name}", 1, "ok")
        for side, names in (("encoder", ("self_attn",)),
                            ("decoder", ("self_attn", "multihead_attn")))
        for i in range(2) for name in names]


def test_a_flex_finding_saves_its_tensors_and_says_what_to_call(tmp_path: Path) -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    from attnkit.check.model import any_flex

    torch.manual_seed(0)
    model = L.FlexModel(layers=1)
    judge = any_flex.judge_flex

    def flipped(call):  # the output of another query: what a broken kernel would give
        call.output = call.output.flip(-2)
        return judge(call)

    import unittest.mock

    with unittest.mock.patch.object(any_flex, "judge_flex", flipped):
        report = check_model(model, (L.tokens(),), save_to=tmp_path)
    f = report.implementations[0].findings[0]
    assert f.code == "inaccurate" and f.layer == "layers.0", report.text()
    assert "flex_attention(d['q'], d['k'], d['v'], score_mod=..." in f.reproducer
    saved = torch.load(next(tmp_path.glob("*.pt")), weights_only=True)
    assert set(saved) == {"q", "k", "v"}


@pytest.mark.parametrize("dtype", ("float32", "float16"))
def test_a_model_without_weights_takes_its_dtype_from_its_inputs(dtype: str) -> None:
    report = check_model(_SDPA(), _sdpa_inputs("plain", dtype))
    assert report.ok and report.dtype == dtype, report.text()
    header = report.text().splitlines()[1].strip()
    assert header.startswith(f"{dtype}, inputs"), header
