"""``check_model`` when something does not run: an implementation that raises (an error,
``call-failed``, never a pass), one transformers refuses (a warning, and a check that
judged no call is not OK), a model folder or config that does not load and caller inputs
that do not fit (one line, no traceback); what a check leaves behind (no outputs kept when
nothing is compared, transformers' registries as they were); the reproducer of a
per-head ``mask-mismatch``; the report in Chinese."""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers",
                    reason="check model needs `pip install attnkit[transformers]`")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_faults import _sdpa, register_faults  # noqa: E402
from transformers import AttentionInterface  # noqa: E402
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.check.catalogue import code_words, render, words  # noqa: E402
from attnkit.check.model.load import tiny_model  # noqa: E402
from attnkit.cli import main  # noqa: E402

register_faults()


def raises_when_decoding_layer_1(module, query, key, value, attention_mask, scaling=None,
                                 dropout=0.0, **kwargs):
    """A kernel with no path for one query on layer 1: right in the prefill, raises at the
    first decoding step."""
    if module.layer_idx == 1 and query.shape[-2] == 1:
        raise RuntimeError("no kernel for a single query\nsecond line of the error")
    return _sdpa(query, key, value, attention_mask, scaling)


def always_raises(module, query, key, value, attention_mask, **kwargs):
    raise RuntimeError("kernel not built for this device")


def leaks_on_head_2(*args, **kwargs):
    """transformers' SDPA mask, one copy per head, with head 2 letting query 4 of batch
    row 1 (4 left pads) see the padded key 0: a per-head mask wrong on one head only."""
    m = sdpa_mask(*args, **kwargs)
    if m is None or m.shape[-2] == 1:
        return m
    m = m.expand(-1, 4, -1, -1).clone()
    m[1, 2, 4, 0] = True
    return m


AttentionInterface.register("fault-raises-decoding", raises_when_decoding_layer_1)
AttentionMaskInterface.register("fault-raises-decoding", sdpa_mask)
AttentionInterface.register("fault-always-raises", always_raises)
AttentionInterface.register("fault-head-2-leak", lambda m, q, k, v, mask, scaling=None, **kw:
                            _sdpa(q, k, v, mask, scaling))
AttentionMaskInterface.register("fault-head-2-leak", leaks_on_head_2)


@functools.cache
def model(family: str):
    return tiny_model(family)


# -- an implementation that raises, or that transformers refuses -------------------------------
def test_a_raise_in_the_attention_function_is_call_failed_where_it_happened():
    report = check_model(model("llama"), implementations=["sdpa", "fault-raises-decoding"],
                         generate=2, padding="left")
    assert report.implementations[0].ok and not report.implementations[0].findings
    fault = report.implementations[1]
    (f,) = fault.findings
    assert (f.code, f.step, f.layer) == ("call-failed", 1, "model.layers.1.self_attn")
    assert f.is_error and not report.ok
    assert "no kernel for a single query" in f.message and "second line" not in f.message
    assert "step 1" in f.message and "model.layers.1.self_attn" in f.message
    assert fault.status.startswith("stopped at step 1")
    assert f.reproducer and "weights_only=True" in f.reproducer
    with pytest.raises(RuntimeError, match="no kernel"):
        exec(f.reproducer, {})


def test_an_implementation_that_raises_on_every_call_fails_the_command(capsys):
    code = main(["check", "model", "--tiny", "llama", "--implementations",
                 "fault-always-raises"])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "call-failed" in out and "kernel not built for this device" in out
    assert "FAILED: 1 error(s)" in out


def test_a_refused_implementation_is_a_warning_and_judging_nothing_is_not_ok(capsys):
    report = check_model(model("gemma2"), implementations=["sdpa"])
    (r,) = report.implementations
    assert r.status.startswith("refused") and r.calls == 0 and r.note
    assert not report.judged and not report.ok
    text = report.text()
    assert "warning  not checked" in text and "no attention call was judged" in text
    assert text.splitlines()[-2].startswith("FAILED: 0 error(s), 1 warning(s)")
    assert main(["check", "model", "--tiny", "gemma2", "--implementations", "sdpa"]) == 1
    assert "not checked" in capsys.readouterr().out
    assert main(["check", "model", "--tiny", "gemma2", "--implementations", "sdpa",
                 "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and out["judged"] is False
    assert out["implementations"][0]["warning"].startswith("sdpa was not checked")


def test_a_refused_implementation_beside_one_that_ran_is_a_warning_only():
    report = check_model(model("gemma2"), implementations=["eager", "sdpa"])
    eager, sdpa = report.implementations
    assert eager.calls == 2 and not eager.note and sdpa.note
    assert report.ok and report.codes == []
    assert "OK: 0 error(s), 1 warning(s)" in report.text()


# -- what does not load, what does not fit ---------------------------------------------------
def _one_line_error(argv, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    return err


def test_a_config_heads_do_not_divide_is_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "hidden_size": 30, "num_attention_heads": 4,
         "num_hidden_layers": 1, "intermediate_size": 16, "vocab_size": 32}))
    for spec in (tmp_path, tmp_path / "config.json"):
        err = _one_line_error(["check", "model", str(spec)], capsys)
        assert f"MODEL {str(spec)!r}" in err and "hidden size (30)" in err, err


def test_corrupt_weights_are_one_line(tmp_path, capsys):
    model("gpt2").save_pretrained(tmp_path)
    (weights,) = tmp_path.glob("*.safetensors")
    weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()  # save_pretrained's progress bar
    err = _one_line_error(["check", "model", str(tmp_path)], capsys)
    assert f"MODEL {str(tmp_path)!r}" in err and "SafetensorError" in err, err


IDS = torch.randint(1, 64, (2, 12), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("inputs, words", [
    ({"input_ids": IDS, "attention_mask": torch.ones(2, 10, dtype=torch.long)},
     "attention_mask (2, 10) does not match input_ids (2, 12)"),
    ({"input_ids": IDS.float()}, "input_ids must hold integer token ids, got torch.float32"),
    ({"input_ids": torch.full((2, 12), 5).index_put_((torch.tensor(1), torch.tensor(3)),
                                                     torch.tensor(64))},
     "input_ids (2, 12) holds ids from 5 to 64; the model's vocabulary has ids 0 to 63"),
    ({"input_ids": IDS[:0]}, "batch and length >= 1, got (0, 12)"),
    ({"input_ids": IDS, "attention_mask": torch.full((2, 12), 2)}, "must hold 0 (padding)"),
], ids=["mask shape", "float ids", "ids past the vocabulary", "batch 0", "mask values"])
def test_caller_inputs_that_do_not_fit_are_a_value_error(inputs, words):
    with pytest.raises(ValueError) as exc:
        check_model(model("llama"), inputs, implementations=["eager"])
    assert words in str(exc.value)


# -- what a check leaves behind --------------------------------------------------------------
def test_one_implementation_keeps_no_outputs_to_compare_with(monkeypatch):
    """Only the first implementation's outputs are kept, and only when another will be
    compared with them."""
    mod = importlib.import_module("attnkit.check.model.check")
    checks = []
    finish = mod._Check.finish

    def spy(self, s):
        checks.append(self)
        return finish(self, s)

    monkeypatch.setattr(mod._Check, "finish", spy)
    check_model(model("llama"), implementations=["eager"], generate=2)
    assert checks[-1].reference_out == {} and checks[-1].reference_hidden == {}
    check_model(model("llama"), implementations=["eager", "sdpa"], generate=2)
    assert len(checks[-1].reference_out) == 2 * 3  # 2 layers x (prefill + 2 steps)
    assert checks[-1].reference_hidden


def test_the_wrappers_leave_transformers_registries_as_they_were():
    def mine(*args, **kwargs):
        raise AssertionError("not called")

    AttentionInterface.register("attnkit-check-sdpa", mine)
    try:
        assert check_model(model("llama"), implementations=["eager", "sdpa"]).ok
        left = [n for iface in (AttentionInterface, AttentionMaskInterface)
                for n in iface._global_mapping if n.startswith("attnkit-check-")
                and n != "attnkit-check-sdpa"]
        assert left == []
        assert AttentionInterface._global_mapping["attnkit-check-sdpa"] is mine
        assert "attnkit-check-sdpa" not in AttentionMaskInterface._global_mapping
    finally:
        AttentionInterface._global_mapping.pop("attnkit-check-sdpa", None)


# -- the reproducer of a mask-mismatch on one head -------------------------------------------
def test_a_per_head_mask_mismatch_names_its_head_and_its_reproducer_fails():
    report = check_model(model("llama"), implementations=["fault-head-2-leak"],
                         padding="left")
    (f,) = report.findings("fault-head-2-leak")
    assert (f.code, f.step, f.batch, f.head, f.query, f.key) == (
        "mask-mismatch", 0, 1, 2, 4, 0)
    with pytest.raises(AssertionError, match="padded key"):  # head 2's mask, as printed
        exec(f.reproducer, {})
    assert "b, h, i, j = 1, 2, 4, 0" in f.reproducer


# -- in Chinese ------------------------------------------------------------------------------
def test_the_report_in_chinese_has_chinese_headers_and_the_same_codes(capsys, monkeypatch):
    report = check_model(model("llama"), implementations=["eager", "fault-flip-layer-1"])
    zh, en = report.text(lang="zh"), report.text(lang="en")
    cw = code_words("mask-polarity", "zh")
    title, diagnosis = cw["title"], cw["what"] + cw["fix"]
    assert zh.startswith("attnkit 检查模型：") and f"mask-polarity：{title}" in zh
    assert diagnosis in zh and words("zh")["model.worst"] in zh and "仅预填充" in zh
    assert "worst error / rule" not in zh and "FAILED" not in zh and "measured:" not in zh
    assert "worst error / rule" in en and "FAILED: 1 error(s)" in en
    finding = report.findings("fault-flip-layer-1")[0]
    assert render(finding.measured, "zh") in zh and finding.reproducer.splitlines()[-1] in zh
    assert finding.measured in en
    data = json.loads(report.to_json("zh"))
    (fz,) = data["implementations"][1]["findings"]
    assert (fz["code"], fz["title"], fz["diagnosis"]) == ("mask-polarity", title, diagnosis)
    monkeypatch.setenv("ATTNKIT_LANG", "zh")
    assert str(report).startswith("attnkit 检查模型：")
    monkeypatch.delenv("ATTNKIT_LANG")
    assert main(["check", "model", "--tiny", "llama", "--implementations",
                 "eager,fault-flip-layer-1", "--lang", "zh"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("attnkit 检查模型：--tiny llama") and "本层产生" in out
    assert "未通过：1 个错误" in out
