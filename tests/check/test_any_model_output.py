"""``check_model`` on any PyTorch model, what it says: every attention module accounted for
(one never judged is "not checked" with the reason), a one-line refusal instead of a
traceback (``nn.Linear``, no inputs, a model that raises), strict JSON, and the command
line: ``attnkit check model FILE.py:NAME --inputs FILE.pt|.safetensors --implementation
FILE.py:FN [--layers ...] --seed N``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import lookalikes as L  # noqa: E402

from attnkit.check import check_model  # noqa: E402
from attnkit.cli import main  # noqa: E402

LOOKALIKES = str(HERE / "lookalikes.py")


def strict_json(text: str) -> dict:
    def refuse(constant: str) -> None:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_a_layer_computing_attention_inline_is_named_not_checked() -> None:
    torch.manual_seed(0)
    report = check_model(L.GPT(inline=(1,)), (L.tokens(),))
    r = report.implementations[0]
    rows = {row.layer: row for row in r.layers}
    assert set(rows) == {"blocks.0.attn", "blocks.1.attn", "blocks.2.attn"}, list(rows)
    assert rows["blocks.1.attn"].verdict == "not checked" and rows["blocks.1.attn"].calls == 0
    assert "made no call of torch.nn.functional.scaled_dot_product_attention" in \
        rows["blocks.1.attn"].note
    text = report.text()
    assert "warning  not checked: blocks.1.attn: it ran but made no call" in text, text
    assert "OK: 0 error(s), 1 warning(s)\n1 attention layer(s) not checked: the verdict " \
        "covers the others only" in text, text
    # nothing named like attention but a layer norm is listed
    torch.manual_seed(0)
    names = [row.layer for row in check_model(L.GPT(), (L.tokens(),)).implementations[0].layers]
    assert names == ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]


@pytest.mark.parametrize("inputs, words", [
    (None, "no inputs were given: pass inputs"),
    ((torch.randn(2, 4),), "Linear made no call of scaled_dot_product_attention"),
    ((torch.randn(2, 5),), "refused: Linear raised RuntimeError"),
])
def test_a_model_without_attention_is_a_one_line_refusal(inputs, words: str) -> None:
    report = check_model(torch.nn.Linear(4, 4), inputs)
    r = report.implementations[0]
    assert not report.ok and not report.judged
    assert words in r.status and "\n" not in r.status, r.status
    text = report.text()
    assert "Traceback" not in text and "no attention call was judged" in text, text
    strict_json(report.to_json())


def test_transformers_only_arguments_are_refused_for_any_model() -> None:
    torch.manual_seed(0)
    report = check_model(L.GPT(), (L.tokens(),), generate=2)
    status = report.implementations[0].status
    assert not report.ok and status.startswith("refused: implementations=, generate= and "
                                               "sample= apply to transformers models"), status


def test_something_that_is_not_a_module_is_refused_in_one_line() -> None:
    report = check_model(42, (torch.randn(2),))
    assert not report.ok
    assert report.implementations[0].status.startswith("refused: a int is not a "
                                                       "torch.nn.Module"), report.text()


def nan_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                  scale=None, enable_gqa=False):
    return torch.full_like(query, float("nan"))


def test_the_json_report_is_strict_json_with_non_finite_errors() -> None:
    torch.manual_seed(0)
    report = check_model(L.GPT(), (L.tokens(),), implementation=nan_attention)
    assert report.codes == ["nan-or-inf"], report.text()
    assert report.implementations[0].layers[0].worst_error == float("inf")
    text = report.to_json()
    data = strict_json(text)
    assert data["implementations"][0]["layers"][0]["worst_error"] == "inf"
    assert data["ok"] is False


def _save_inputs(tmp_path: Path, kind: str) -> Path:
    if kind == "pt":
        path = tmp_path / "inputs.pt"
        torch.save((L.tokens(),), path)
        return path
    from safetensors.torch import save_file

    path = tmp_path / "inputs.safetensors"
    save_file({"idx": L.tokens()}, str(path))
    return path


@pytest.mark.parametrize("kind", ("pt", "safetensors"))
def test_the_command_checks_a_model_from_a_file_with_saved_inputs(kind: str, tmp_path: Path,
                                                                   capsys) -> None:
    inputs = _save_inputs(tmp_path, kind)
    code = main(["check", "model", f"{LOOKALIKES}:build_gpt", "--inputs", str(inputs),
                 "--dtype", "float64", "--json"])
    data = strict_json(capsys.readouterr().out)
    assert code == 0 and data["ok"] and data["dtype"] == "float64", data
    assert [row["layer"] for row in data["implementations"][0]["layers"]] == \
        ["blocks.0.attn", "blocks.1.attn", "blocks.2.attn"]


def test_the_command_judges_your_function_in_the_layers_named(tmp_path: Path, capsys) -> None:
    inputs = _save_inputs(tmp_path, "pt")
    code = main(["check", "model", f"{LOOKALIKES}:build_gpt", "--inputs", str(inputs),
                 "--implementation", f"{LOOKALIKES}:unscaled", "--layers", "blocks.2.*",
                 "--seed", "3", "--save", str(tmp_path / "repro")])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "error    wrong-scale" in out and "first layer whose own attention fails: " \
        "blocks.2.attn" in out, out
    assert f"fn = load_target('{LOOKALIKES}:unscaled')" in out, out
    assert list((tmp_path / "repro").glob("*.pt")), "the reproducer's inputs were not saved"


@pytest.mark.parametrize("argv, words", [
    (["--inputs", "x.npy"], "must be a .pt or .safetensors file"),
    (["--inputs", "missing.pt"], "no such file"),
    ([], "gives no inputs: pass --inputs FILE.pt"),
    (["--implementation", f"{LOOKALIKES}:nope"], "--implementation"),
    (["--layers", "blocks.1.attn"], "--layers needs --implementation"),
    (["--generate", "2"], "a FILE.py model runs its own forward once"),
    (["--sample", "4"], "--sample and --implementations apply to transformers models"),
])
def test_command_refusals_are_one_line(argv: list[str], words: str, capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["check", "model", f"{LOOKALIKES}:build_gpt", *argv])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_inputs_that_hold_code_are_not_run(tmp_path: Path, capsys) -> None:
    path = tmp_path / "inputs.pt"
    torch.save({"idx": L.tokens(), "obj": L.GPT}, path)  # a class: not weights-only
    with pytest.raises(SystemExit):
        main(["check", "model", f"{LOOKALIKES}:build_gpt", "--inputs", str(path)])
    err = capsys.readouterr().err
    assert "does not read with torch.load(weights_only=True)" in err, err


def test_a_transformers_model_runs_your_function_in_place_of_its_sdpa_calls() -> None:
    pytest.importorskip("transformers")
    from attnkit.check.model.load import tiny_model

    model = tiny_model("gpt2")
    clean = check_model(model, implementation=L.plain_attention)
    assert clean.ok and [row.layer for row in clean.implementations[0].layers] == \
        ["transformer.h.0.attn", "transformer.h.1.attn"], clean.text()
    bad = check_model(model, implementation={"transformer.h.1.attn": L.unscaled})
    assert bad.codes == ["wrong-scale"], bad.text()
    assert bad.implementations[0].first_failing_layer == "transformer.h.1.attn"
    assert model.config._attn_implementation == "eager"  # put back


class _DropoutAlways(torch.nn.Module):
    def forward(self, q):
        return torch.nn.functional.scaled_dot_product_attention(q, q, q, dropout_p=0.1)


def test_a_call_with_dropout_in_eval_mode_is_named_not_a_pass() -> None:
    report = check_model(_DropoutAlways(), (torch.randn(2, 4, 5, 8),))
    r = report.implementations[0]
    assert not report.ok and not report.judged, report.text()
    assert r.layers[0].note.startswith("dropout_p=0.1 (random by design)"), r.layers[0]
    assert r.status == ("refused: no attention call could be judged: dropout_p=0.1 (random by "
                        "design): call the model in eval mode with dropout_p=0.0 there"), r.status


def test_layers_whose_short_names_would_merge_are_printed_in_full() -> None:
    from attnkit.check.model.report import ImplementationResult, LayerRow, ModelReport

    long = "vision_tower.encoder.stage_{}.blocks.0.attention_with_relative_bias"
    r = ImplementationResult("torch", layers=[LayerRow(long.format(i)) for i in (1, 2)])
    text = ModelReport("M", "float32", "x", [r]).text()
    assert long.format(1) in text and long.format(2) in text, text


def test_only_one_call_is_held_at_a_time(monkeypatch) -> None:
    """Memory bounded by one layer: when a call is judged, no earlier call's recorded
    tensors are alive any more."""
    import gc
    import weakref

    from attnkit.check.model import any_model

    held: list = []
    judge = any_model.judge_call

    def judging(call):
        gc.collect()
        alive = [r for r in held if r() is not None]
        assert not alive, f"{len(alive)} earlier call(s) still held at call {call.index}"
        held.extend(weakref.ref(call.arguments[n]) for n in ("query", "key", "value"))
        return judge(call)

    monkeypatch.setattr(any_model, "judge_call", judging)
    torch.manual_seed(0)
    report = check_model(L.Seq2Seq(), (L.tokens(), L.padded(), L.tokens(length=3, seed=1)))
    assert report.ok and report.implementations[0].calls == 14 and len(held) == 42


def test_every_model_report_says_in_json_whether_the_oracle_compared_it() -> None:
    """``--json`` carries ``"oracle"`` on every report, as the function and multi-head
    checks do: compared for a run whose calls were judged, not compared (and why) for one
    that judged none."""
    judged = json.loads(check_model(L.GPT(), (L.tokens(),)).to_json())
    assert judged["oracle"] == {"compared": True, "why": ""}
    refused = json.loads(check_model(torch.nn.Linear(4, 4), (torch.randn(2, 4),)).to_json())
    assert refused["oracle"]["compared"] is False and refused["oracle"]["why"]
