"""The other readings of a call (causal aligned the other way, the mask read the other way
round, a causal leak, padding or a window ignored, another scale) are one chain
(``attnkit.check.core.readings``) that every judge tries: an SDPA call of a model checked
with ``implementation=``, a transformers ``AttentionInterface`` call, an
``nn.MultiheadAttention`` call and a ``flex_attention`` call name the same bug with the same
code and the same sentence. The kernels here are look-alikes written for these tests."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import lookalikes as L  # noqa: E402

from attnkit.check import check_model  # noqa: E402


def _own_causal(query, key, value, scale):
    """Plain math with a causal mask the kernel builds itself (bottom-right)."""
    G = query.shape[-3] // key.shape[-3]
    key, value = key.repeat_interleave(G, -3), value.repeat_interleave(G, -3)
    s = (query @ key.transpose(-1, -2)) * scale
    Tq, Tk = s.shape[-2:]
    s = s.masked_fill(~torch.ones(Tq, Tk, dtype=torch.bool).tril(Tk - Tq), -math.inf)
    return s.softmax(-1) @ value


def causal_no_padding(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                      scale=None, enable_gqa=False):
    """SDPA's signature; never reads ``attn_mask``, so padded keys get weight."""
    return _own_causal(query, key, value,
                       1.0 / math.sqrt(query.shape[-1]) if scale is None else scale)


def causal_no_padding_hf(module, query, key, value, attention_mask, scaling=None,
                         dropout=0.0, **kwargs):
    """The same kernel behind transformers' ``AttentionInterface``."""
    return _own_causal(query, key, value, scaling).transpose(1, 2).contiguous(), None


def over_dk(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
            enable_gqa=False):
    """Divides the scores by Dk instead of sqrt(Dk)."""
    return L.plain_attention(query, key, value, attn_mask, is_causal=is_causal,
                             scale=1.0 / query.shape[-1])


def test_a_kernel_with_its_own_causal_mask_is_padding_ignored_on_both_paths() -> None:
    pytest.importorskip("transformers")
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    from attnkit.check.model.load import tiny_model

    AttentionInterface.register("test-causal-no-padding", causal_no_padding_hf)
    AttentionMaskInterface.register("test-causal-no-padding", sdpa_mask)
    hf = check_model(tiny_model("llama"), implementations=["test-causal-no-padding"],
                     padding="left")
    mine = check_model(tiny_model("llama"), implementation=causal_no_padding, padding="left")
    (a,), (b,) = (r.implementations[0].findings[:1] for r in (hf, mine))
    assert (a.code, a.layer) == ("padding-ignored", "model.layers.0.self_attn"), hf.text()
    assert (b.code, b.layer) == ("padding-ignored", "model.layers.0.self_attn"), mine.text()
    assert str(a.message) == str(b.message)
    assert mine.implementations[0].layers[0].verdict == "padding-ignored"


def test_a_kernel_that_ignores_the_sliding_window_is_named_through_sdpa_calls() -> None:
    pytest.importorskip("transformers")
    from attnkit.check.model.load import tiny_model

    report = check_model(tiny_model("mistral"), implementation=causal_no_padding,
                         padding="none")
    f = report.implementations[0].findings[0]
    assert f.code == "mask-mismatch", report.text()
    assert "sliding window of 4" in str(f.message), report.text()


class _SDPA(torch.nn.Module):
    def forward(self, q, k, v, **kw):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)


def test_an_sdpa_call_scaled_by_one_over_dk_is_wrong_scale_with_the_scale_named() -> None:
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))
    report = check_model(_SDPA(), {"q": q, "k": k, "v": v, "is_causal": True},
                         implementation=over_dk)
    (f,) = report.implementations[0].findings
    assert f.code == "wrong-scale", report.text()
    assert "1/Dk" in str(f.message), report.text()


class _NoPaddingMHA(L.HandMHA):
    """A hand-written ``nn.MultiheadAttention`` that drops ``key_padding_mask``."""

    def forward(self, query, key, value, key_padding_mask=None, **kw):
        return super().forward(query, key, value, None, **kw)


def test_an_mha_that_drops_key_padding_mask_is_padding_ignored() -> None:
    torch.manual_seed(0)
    model = L.MHAModel(planted=_NoPaddingMHA(L.WIDTH, L.HEADS))
    pad = ~L.padded().flip(-1)  # left padding: real queries may see padded keys
    report = check_model(model, (L.tokens(), pad))
    codes = [(f.code, f.layer) for f in report.implementations[0].findings]
    assert codes == [("padding-ignored", "causal")], report.text()


def test_a_flex_output_without_its_mask_mod_is_causal_leak() -> None:
    pytest.importorskip("torch.nn.attention.flex_attention")
    from attnkit.check.model.any_model import judge_call
    from attnkit.check.model.torch_calls import CallRecorder

    torch.manual_seed(0)
    model, found = L.FlexModel(layers=1), []

    def on_call(call) -> None:
        q, k, v, score_mod = call.arguments["args"][:4]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        B, H, T, S = s.shape
        grid = (torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1),
                torch.arange(T).view(1, 1, T, 1), torch.arange(S).view(1, 1, 1, S))
        call.output = score_mod(s, *grid).softmax(-1) @ v  # every key: no mask_mod
        j = judge_call(call)
        found.append((j.code, str(j.message)))

    with torch.no_grad(), CallRecorder(model, on_call):
        model(L.tokens())
    assert [c for c, _ in found] == ["causal-leak"], found
    assert "later keys" in found[0][1]


def test_empty_rows_whose_values_were_not_read_print_their_count_alone() -> None:
    """The any-model path counts rows with no allowed key without reading what they hold:
    the table prints the count, never ``4 ()``."""
    keep = torch.tensor([[True] * 6, [False] * 2 + [True] * 4])[:, None, None, :]
    mask = keep & torch.ones(6, 6, dtype=torch.bool).tril()  # left padding, causal
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, 6, 8) for _ in range(3))
    report = check_model(_SDPA(), {"q": q, "k": k, "v": v, "attn_mask": mask})
    row = report.implementations[0].layers[0]
    assert row.empty_rows == 2 and not row.empty_hold, report.text()
    line = next(x for x in report.text().splitlines() if x.strip().startswith("(model)"))
    assert " 2 " in line and "()" not in line, line


def test_a_forward_that_raises_in_float16_only_is_float16_overflow_with_its_line() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "impl_half"))
    import fill_model

    model, (ids, pad) = fill_model.build()
    report = check_model(model.half(), (ids, pad))
    r = report.implementations[0]
    assert r.status == "ran" and report.codes == ["float16-overflow"], report.text()
    f = r.findings[0]
    assert f.layer == "attn" and "-1e9" in str(f.message) and "masked_fill" in str(f.message)
    assert [row.layer for row in r.layers] == ["attn"], report.text()
    assert check_model(model.float(), (ids, pad)).codes == []  # float32: nothing to say


def test_a_forward_that_returns_nan_in_float16_only_is_float16_overflow_at_its_module() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent / "impl_half"))
    import score_model

    model, inputs = score_model.build()
    report = check_model(model.half(), inputs)
    r = report.implementations[0]
    assert r.status == "ran" and report.codes == ["float16-overflow"], report.text()
    assert r.findings[0].layer == "attn" and not report.ok
    assert check_model(model.float(), inputs).codes == []
