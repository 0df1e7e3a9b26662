"""``check_model`` / ``attnkit check model``: every attention call of a transformers model.

Correct implementations (eager, SDPA, attnkit) on tiny random models of every family the
integration supports pass with no finding, in float32 and bfloat16, padded left or right,
prefill and decoding. Planted faults (``model_faults.py``: look-alikes of kernels people
register) are each found at the right layer, step and query with the right code, and the
reproducer saved for them loads with ``weights_only=True`` and fails as printed. Tiny
models: 2 layers, width 32, a sliding window of 4 on sequences of 12.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers",
                    reason="check model needs `pip install attnkit[transformers]`")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from model_faults import register_faults  # noqa: E402

from attnkit.check import CODES, check_model  # noqa: E402
from attnkit.check.catalogue import code_words  # noqa: E402
from attnkit.check.model.load import TINY_FAMILIES, make_inputs, tiny_model  # noqa: E402
from attnkit.cli import main  # noqa: E402

register_faults()

# transformers refuses SDPA for the families whose attention needs what SDPA lacks.
NO_SDPA = ("gemma2", "gpt_oss")


@functools.cache
def model(family: str, dtype: str = "float32"):
    return tiny_model(family, dtype)


def implementations(family: str) -> list[str]:
    return ["eager", "attnkit"] if family in NO_SDPA else ["eager", "sdpa", "attnkit"]


def assert_clean(report, generate: int) -> None:
    assert report.ok and report.codes == [], report.table()
    for r in report.implementations:
        assert r.status == "ran", (r.name, r.status)
        assert r.layers, r.name
        for row in r.layers:
            assert row.calls in (1, generate + 1), (r.name, row)  # T5's encoder runs once
            assert row.verdict == "ok" and row.worst_error <= row.bound, (r.name, row)
            assert row.origin == "", (r.name, row)


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_correct_implementations_pass_left_padded_decoding(family):
    report = check_model(model(family), implementations=implementations(family),
                         generate=2, padding="left")
    assert_clean(report, 2)
    eager = report.implementations[0]
    assert "additive float mask" in eager.masks
    assert report.implementations[-1].masks == ["attnkit structured mask"]
    for r in report.implementations[1:]:  # compared with eager, layer by layer
        assert all(row.diff_attention is not None and row.diff_attention < 1e-4
                   for row in r.layers), r.layers
        assert r.hidden and max(h["diff"] for h in r.hidden) < 1e-4


def test_empty_rows_are_counted_and_described():
    """Row 1 has 4 left pads: 4 padded queries with no key per layer; eager averages
    them (uniform), SDPA and attnkit give 0. Neither is a finding."""
    report = check_model(model("llama"), generate=1, padding="left")
    holds = {r.name: {h for row in r.layers for h in row.empty_hold}
             for r in report.implementations}
    assert holds == {"eager": {"uniform"}, "sdpa": {"0"}, "attnkit": {"0"}}
    assert all(row.empty_rows == 4 for r in report.implementations for row in r.layers)


@pytest.mark.parametrize("family, padding", [("llama", "right"), ("gemma2", "left"),
                                             ("t5", "right")])
def test_bfloat16_passes(family, padding):
    report = check_model(model(family, "bfloat16"), implementations=implementations(family),
                         generate=2, padding=padding)
    assert report.dtype == "bfloat16"
    assert_clean(report, 2)


@pytest.mark.parametrize("padding", ["right", "none"])
def test_prefill_right_and_no_padding(padding):
    assert_clean(check_model(model("mistral"), padding=padding), 0)


def test_packed_documents_prefill():
    """Position ids that restart mark packed documents (no cache, as transformers packs
    only then): the correct implementations pass; one that never gets the packed mask
    (registered without a mask function, so it receives None) lets queries see keys of
    the document before: a mask-mismatch at the first token of document 2."""
    ids = torch.randint(1, 64, (1, 12), generator=torch.Generator().manual_seed(0))
    pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
    report = check_model(model("llama"), {"input_ids": ids, "position_ids": pos},
                         implementations=["eager", "sdpa", "attnkit", "fault-no-window"])
    clean = [r for r in report.implementations if r.name != "fault-no-window"]
    assert all(r.ok and not r.findings for r in clean), report.table()
    (f,) = report.findings("fault-no-window")
    assert (f.code, f.step, f.batch, f.query, f.key) == ("mask-mismatch", 0, 0, 5, 0)
    assert "another packed document" in f.message


def test_a_model_saved_with_save_pretrained_is_checked_from_its_folder(tmp_path, capsys):
    model("gpt2").save_pretrained(tmp_path)
    assert list(tmp_path.glob("*.safetensors"))
    report = check_model(str(tmp_path), generate=1)
    assert report.model == str(tmp_path)
    assert_clean(report, 1)
    assert main(["check", "model", str(tmp_path), "--generate", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is True and [r["name"] for r in out["implementations"]] == [
        "eager", "sdpa", "attnkit"]
    # the config alone: the same family with random weights
    report = check_model(str(tmp_path / "config.json"), implementations=["eager", "sdpa"])
    assert report.implementations[0].layers[0].layer == "transformer.h.0.attn"
    assert_clean(report, 0)


def test_a_config_that_needs_remote_code_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "mything", "auto_map": {"AutoModel": "modeling_mything.MyModel"}}))
    with pytest.raises(SystemExit) as exc:
        main(["check", "model", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "trust_remote_code" in err
    assert len(err.strip().splitlines()) == 1, err


def test_nothing_but_a_local_path_is_accepted(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["check", "model", "meta-llama/Llama-3.2-1B"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "downloads nothing" in err


# -- planted faults --------------------------------------------------------------------------
def _run_reproducer(finding, expected: type[BaseException]) -> None:
    """The printed lines run as printed (after the fault is registered) and fail."""
    assert finding.reproducer and "weights_only=True" in finding.reproducer
    with pytest.raises(expected):
        exec(finding.reproducer, {})


def test_top_left_causal_is_found_at_the_first_decoding_step():
    report = check_model(model("llama"), implementations=["sdpa", "fault-top-left"],
                         generate=2, padding="none")
    assert report.implementations[0].ok and not report.implementations[0].findings
    fault = report.implementations[1]
    (f,) = fault.findings
    assert (f.code, f.step, f.layer, f.query) == (
        "causal-alignment", 1, "model.layers.0.self_attn", 0)
    assert f.is_error and not report.ok
    assert fault.first_failing_layer == "model.layers.0.self_attn (step 1)"
    assert [row.origin for row in fault.layers] == ["made here", "made here"]
    _run_reproducer(f, AssertionError)


def test_a_minus_1e9_fill_in_float16_is_found_in_the_first_call():
    report = check_model(model("llama", "float16"), implementations=["sdpa", "fault-fill-1e9"],
                         padding="left")
    assert report.implementations[0].ok and not report.implementations[0].findings
    fault = report.implementations[1]
    (f,) = fault.findings
    assert (f.code, f.step, f.layer) == ("float16-overflow", 0, "model.layers.0.self_attn")
    assert fault.status.startswith("stopped at step 0")
    _run_reproducer(f, RuntimeError)
    # the same function in float32 is right
    assert check_model(model("llama"), implementations=["fault-fill-1e9"]).ok


def test_a_mask_flipped_on_one_layer_is_found_there():
    report = check_model(model("llama"), implementations=["eager", "fault-flip-layer-1"],
                         padding="left")
    fault = report.implementations[1]
    (f,) = fault.findings
    assert (f.code, f.step, f.layer, f.batch, f.query) == (
        "mask-polarity", 0, "model.layers.1.self_attn", 0, 0)
    row0, row1 = fault.layers
    assert row0.verdict == "ok" and row0.origin == ""  # layer 0 is right
    assert row1.verdict == "mask-polarity" and row1.origin == "made here"
    _run_reproducer(f, AssertionError)


def test_an_ignored_sliding_window_is_found_at_the_first_query_past_it():
    report = check_model(model("mistral"), implementations=["sdpa", "fault-no-window"],
                         padding="none")
    fault = report.implementations[1]
    (f,) = fault.findings
    assert (f.code, f.step, f.layer, f.query) == (
        "mask-mismatch", 0, "model.layers.0.self_attn", 4)  # window 4: query 4 is the first
    assert "sliding window of 4" in f.message
    _run_reproducer(f, AssertionError)


def test_a_function_that_never_gets_the_padding_is_a_mask_mismatch():
    """Registered without a mask function, a kernel receives mask=None: with left padding
    the first real query of row 1 (4 pads) may see the padded key 0."""
    report = check_model(model("llama"), implementations=["fault-no-window"], padding="left")
    (f,) = report.findings("fault-no-window")
    assert (f.code, f.step, f.batch, f.query, f.key) == ("mask-mismatch", 0, 1, 4, 0)
    assert "a padded key" in f.message
    _run_reproducer(f, AssertionError)


def test_the_command_exits_1_on_a_fault_and_prints_the_table(capsys):
    code = main(["check", "model", "--tiny", "llama", "--implementations",
                 "eager,fault-flip-layer-1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "mask-polarity" in out and "layers.1.self_attn" in out and "made here" in out
    assert "FAILED: 1 error(s)" in out


def test_the_command_writes_the_report_in_chinese(capsys):
    code = main(["check", "model", "--tiny", "llama", "--implementations",
                 "eager,fault-flip-layer-1", "--lang", "zh"])
    out = capsys.readouterr().out
    assert code == 1
    zh = code_words("mask-polarity", "zh")
    title, diagnosis = zh["title"], zh["what"] + zh["fix"]
    assert out.startswith("attnkit 检查模型：--tiny llama"), out[:80]
    assert f"mask-polarity：{title}" in out and diagnosis in out and "layers.1.self_attn" in out
    assert "最大误差 / 规则" in out and "未通过：1 个错误" in out
    assert main(["check", "model", "--tiny", "llama", "--implementations",
                 "eager,fault-flip-layer-1", "--lang", "zh", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    found = [f for r in data["implementations"] for f in r["findings"]]
    assert found and all(f["title"] == code_words(f["code"], "zh")["title"] for f in found)


def test_the_command_prints_the_table_and_exits_0(capsys):
    assert main(["check", "model", "--tiny", "qwen2", "--generate", "1", "--sample", "3"]) == 0
    out = capsys.readouterr().out
    assert "worst error / rule" in out and "OK: 0 error(s)" in out


@pytest.mark.parametrize("argv, words", [
    (["check", "model"], "give MODEL"),
    (["check", "model", "--tiny", "llama", "--implementations", "nope"], "nope"),
    (["check", "model", "--tiny", "bert"], "invalid choice"),
])
def test_bad_arguments_are_one_line_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_mask_mismatch_is_a_known_error_code():
    assert CODES["mask-mismatch"][0] == "error"


def test_random_inputs_pad_the_side_asked_for():
    inputs = make_inputs(model("llama"), batch=3, length=8, padding="right")
    assert inputs["attention_mask"].tolist() == [[1] * 8, [1] * 6 + [0] * 2, [1] * 4 + [0] * 4]


def test_without_transformers_the_command_names_the_extra():
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(os.environ, PYTHONPATH=src)
    script = textwrap.dedent("""
        import sys
        sys.modules["transformers"] = None
        from attnkit.cli import main
        raise SystemExit(main(["check", "model", "--tiny", "llama"]))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "pip install 'attnkit[transformers]'" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_sample_judges_a_subset_of_heads_and_queries():
    """--sample 2: heads 0 and 3 of 4 (with their key/value heads and sinks), queries 0 and
    11 of 12: still clean on correct implementations, still finding a planted fault."""
    assert_clean(check_model(model("gpt_oss"), implementations=["eager", "attnkit"],
                             generate=1, sample=2), 1)
    report = check_model(model("llama"), implementations=["fault-flip-layer-1"], sample=2)
    (f,) = report.findings("fault-flip-layer-1")
    assert (f.code, f.layer) == ("mask-polarity", "model.layers.1.self_attn")
    assert f.head in (0, 3) and f.query in (0, 11)


def test_nan_in_rows_with_no_key_is_named_where_it_starts():
    """A -inf fill with no guard: layer 0 gives NaN on the padded queries (a warning there:
    what a row with no key holds), and layer 1 fails on real queries, with the cause
    named: NaN at masked keys reaching the output as 0 * NaN."""
    report = check_model(model("llama"), implementations=["fault-nan-rows"], padding="left")
    result = report.implementations[0]
    codes = {f.code: f for f in result.findings}
    assert set(codes) == {"nan-or-inf", "fully-masked-row"}
    assert codes["fully-masked-row"].layer == "model.layers.0.self_attn"
    assert result.layers[0].empty_hold == ["NaN"] and result.layers[0].verdict == "ok"
    nan = codes["nan-or-inf"]
    assert (nan.layer, nan.batch) == ("model.layers.1.self_attn", 1)
    assert "0 * NaN" in nan.message
