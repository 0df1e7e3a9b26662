"""`attnkit check` on code as people hand it over: classes built from their constructor's
parameter names, config objects, instances, bound methods, notebooks, modules that keep the
weights of the last forward on ``self``, dropout left on, printing targets, targets that
raise. Whatever the target does, a report (never a traceback), and every reproducer runs
as printed and fails while the bug is there.

The implementations under tests/check/impl_loading/ are look-alikes of common patterns,
written for these tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

import attnkit  # noqa: E402
from attnkit.check import (  # noqa: E402
    check_attention,
    check_multi_head,
    check_softmax,
    load_target,
)
from attnkit.cli import main  # noqa: E402

SRC = Path(attnkit.__file__).resolve().parents[1]  # the attnkit under test, for subprocesses
IMPL = Path(__file__).resolve().parent / "impl_loading"


def target(spec: str):
    return load_target(f"{IMPL}/{spec}")


def run_script(code: str, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """Run ``code`` as a fresh Python process, as a user pasting a reproducer would."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=cwd or os.getcwd(), timeout=180,
                          env={**os.environ, "PYTHONPATH": str(SRC)})


def assert_reproducer_fails(code: str, cwd: Path | str | None = None) -> None:
    assert "= ..." not in code, f"a placeholder in the reproducer:\n{code}"
    proc = run_script(code, cwd)
    assert proc.returncode == 1, f"the reproducer ran clean:\n{code}\n{proc.stdout}"
    tail = proc.stderr.strip().splitlines()[-1]
    # It fails on the bug: an assert, or the module's own error; never on its own lines.
    assert not tail.startswith(("NameError", "SyntaxError", "ImportError", "TypeError",
                                "AttributeError", "ModuleNotFoundError")), proc.stderr


# -- a class as TARGET: built from its constructor's parameter names ---------------------------
BUILT = [
    ("orders.py:HeadsFirst", "built as HeadsFirst(h=4, d_model=16, dropout=0.0)"),
    ("orders.py:WidthHeadsDropout",
     "built as WidthHeadsDropout(d_model=16, num_heads=4, dropout=0.0)"),
    ("orders.py:HeadsWidthKV", "built as HeadsWidthKV(n_head=4, d_model=16, d_k=4, d_v=4, "
                               "dropout=0.0)"),
    ("orders.py:HiddenRateHeadSize",
     "built as HiddenRateHeadSize(hidden_size=16, dropout_rate=0.0, head_size=4)"),
    ("orders.py:ConfigCausal",
     "built as ConfigCausal(config=TinyConfig(n_head=4, n_embd=16, dropout=0.0))"),
    ("orders.py:PlainConfigSelfAttention", "built as PlainConfigSelfAttention(config=PlainSettings("
     "hidden_size=16, num_attention_heads=4, attention_probs_dropout_prob=0.0))"),
    ("orders.py:make", "built as make(E=16, H=4)"),
    ("cached.py:CachedFixed", "built as CachedFixed(h=4, d_model=16, dropout=0.0)"),
    ("cached.py:CachedWeightsList",
     "built as CachedWeightsList(num_hiddens=16, num_heads=4, dropout=0.0)"),
    ("cached.py:LazyValidLens", "built as LazyValidLens(num_hiddens=16, num_heads=4, dropout=0.0)"),
]


@pytest.mark.parametrize("spec, how", BUILT, ids=[b[0].split(":")[1] for b in BUILT])
def test_a_correct_class_is_built_from_its_parameter_names_and_passes(spec, how):
    report = check_multi_head(target(spec), convention="keep" if "HeadsFirst" in spec
                              or "CachedFixed" in spec else "auto")
    assert report.findings == [], report.table()
    assert report.origin == how
    assert how in report.table()
    assert len(report.cases) >= 8  # the probes ran, not a short cut
    assert report.seconds < 60


def test_a_signature_no_rule_reads_gets_one_line_with_the_factory_form():
    report = check_multi_head(target("orders.py:NeedsVocabulary"))
    assert report.codes == ["call-failed"], report.table()
    msg = report.findings[0].message
    assert "NeedsVocabulary(d_model, num_heads, tokenizer)" in msg and "tokenizer" in msg
    assert "def make(E, H): return NeedsVocabulary(E, H, tokenizer=...)" in msg
    assert "attnkit check multi-head " in msg and "impl_loading/orders.py:make" in msg
    assert "\n" not in msg


def test_a_keyword_only_forward_with_query_key_value_names_is_called_by_name():
    report = check_multi_head(target("orders.py:KeywordOnlyNamedForward"))
    assert report.ok and "call-failed" not in report.codes, report.table()
    assert "inputs by name query=, key=, value=" in report.layout

@pytest.mark.parametrize("spec, words", [
    ("orders.py:RaisesInInit", "RuntimeError: this module needs a GPU build"),
    ("orders.py:KeywordOnlyForward", "takes 1 positional argument"),
    ("orders.py:RaisesOnEveryInput", "NotImplementedError: forward is left for the exercise"),
])
def test_a_module_that_cannot_be_built_or_called_is_call_failed_not_shape(spec, words):
    """A constructor that raises, a keyword-only forward, a forward that always raises:
    what was tried and the exception, as call-failed (they are not shape bugs)."""
    report = check_multi_head(target(spec))
    assert report.codes == ["call-failed"], report.table()
    assert words in report.findings[0].message
    assert "factory" in report.findings[0].message or "--convention" in \
        report.findings[0].message


# -- tensors a forward leaves on self --------------------------------------------------------
def test_weights_cached_on_self_do_not_stop_the_probes_and_the_float16_bug_is_found():
    """The module keeps ``self.attn`` from its forward: no deep copy of it may crash, the
    cached tensor is not an unregistered parameter, and the float16 probe then runs and
    finds the -1e9 fill."""
    report = check_multi_head(target("cached.py:CachedFill1e9"), convention="keep")
    assert report.codes == ["float16-overflow", "fully-masked-row"], report.table()
    for finding in report.findings:
        assert_reproducer_fails(finding.reproducer)
        fixed = finding.reproducer.replace("CachedFill1e9", "CachedFixed")
        proc = run_script(fixed)
        assert proc.returncode == 0, f"{fixed}\n{proc.stderr}"


def test_a_reproducer_builds_the_config_object_as_the_check_did():
    report = check_multi_head(target("orders.py:ConfigNaiveSoftmax"))
    assert report.codes == ["nan-or-inf"], report.table()
    assert report.origin == "built as ConfigNaiveSoftmax(config=TinyConfig(n_head=4, n_embd=16, " \
                            "dropout=0.0))"
    repro = report.findings[0].reproducer
    assert "TinyConfig = load_target(" in repro
    assert_reproducer_fails(repro)
    proc = run_script(repro.replace("ConfigNaiveSoftmax", "ConfigCausal"))
    assert proc.returncode == 0, proc.stderr


def test_an_instance_that_has_run_is_checked_without_a_deep_copy_of_its_state():
    layer = target("cached.py:layer")
    import torch

    x = torch.randn(2, 5, 16)
    layer(x, x, x, torch.ones(2, 5, 5, dtype=torch.bool))  # now layer.attn is a non-leaf
    assert layer.attn.grad_fn is not None
    before = {k: v.clone() for k, v in layer.state_dict().items()}
    report = check_multi_head(layer, convention="keep")
    assert report.codes == ["float16-overflow", "fully-masked-row"], report.table()
    assert report.origin == "the instance layer, as loaded"
    assert "load_target(" in report.findings[0].reproducer
    assert_reproducer_fails(report.findings[0].reproducer)
    # The check worked on copies: the caller's instance is as it was.
    assert layer.training and layer.dropout.p == 0.0
    assert all(torch.equal(before[k], v) for k, v in layer.state_dict().items())


def test_an_instance_that_cannot_be_copied_is_checked_as_a_fresh_one_of_its_class():
    report = check_multi_head(target("cached.py:locked"), convention="keep")
    assert report.findings == [], report.table()
    assert report.origin.startswith("built as HoldsLock(h=4, d_model=16, dropout=0.0), a fresh")
    assert "cannot be copied" in report.origin


# -- dropout --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", ["targets.py:in_train_mode",
                                  "targets.py:attention_always_dropout"])
def test_dropout_left_on_is_nondeterministic_not_inaccurate(spec):
    report = check_attention(target(spec))
    assert report.codes == ["nondeterministic"], report.table()
    assert "dropout is on: call `.eval()` or pass dropout 0" in report.findings[0].message
    assert_reproducer_fails(report.findings[0].reproducer)


def test_a_numpy_class_whose_dropout_is_always_on_is_nondeterministic():
    report = check_multi_head(target("numpy_random.py:DropoutAlways"))
    assert report.codes == ["nondeterministic"], report.table()
    assert report.seconds < 30
    assert_reproducer_fails(report.findings[0].reproducer)


def test_the_module_in_train_mode_passes_once_in_eval():
    layer = target("targets.py:in_train_mode")
    try:
        assert check_attention(layer.eval()).findings == []
    finally:
        layer.train()


def test_dropout_in_eval_is_one_finding_not_also_state_dict():
    report = check_multi_head(target("targets.py:HardDropoutInEval"))
    assert report.codes == ["dropout-in-eval"], report.table()
    assert_reproducer_fails(report.findings[0].reproducer)


# -- classes, instances and bound methods given to a function check ---------------------------
@pytest.mark.parametrize("spec, origin", [
    ("targets.py:ScaledDot", "built as ScaledDot(dropout=0.0).eval()"),
    ("targets.py:scaled", ""),
    ("targets.py:scaled.forward", ""),
])
def test_a_correct_class_instance_or_bound_method_passes(spec, origin):
    report = check_attention(target(spec))
    assert report.findings == [] and report.origin == origin, report.table()


@pytest.mark.parametrize("spec", ["targets.py:Unscaled", "targets.py:unscaled",
                                  "targets.py:unscaled.forward"])
def test_reproducers_load_the_class_instance_or_bound_method_and_fail(spec):
    report = check_attention(target(spec))
    assert report.codes == ["wrong-scale"], report.table()
    repro = report.findings[0].reproducer
    assert spec.split(":")[1].split(".")[0] in repro
    assert_reproducer_fails(repro)
    fixed = (repro.replace("Unscaled", "ScaledDot").replace("ScaledDot()", "ScaledDot(0.0)")
             .replace(":unscaled", ":scaled"))
    proc = run_script(fixed)
    assert proc.returncode == 0, f"{fixed}\n{proc.stderr}"


def test_an_attention_function_given_as_a_module_says_which_check_to_run():
    report = check_multi_head(target("targets.py:attention_printing"))
    assert report.codes == ["call-failed"], report.table()
    assert "attnkit check attention" in report.findings[0].message


def test_a_class_that_needs_arguments_for_a_function_check_is_call_failed():
    report = check_attention(target("targets.py:NeedsTemperature"))
    assert report.codes == ["call-failed"], report.table()
    assert "temperature" in report.findings[0].message
    assert "instance" in report.findings[0].message


def test_a_function_that_raises_on_every_input_is_call_failed():
    report = check_attention(target("targets.py:attention_raises"))
    assert report.codes == ["call-failed"], report.table()
    assert "NotImplementedError: TODO: write attention" in report.findings[0].message


# -- the command: stdout is the report alone ---------------------------------------------------
def command(*argv: str, cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "attnkit", *argv], capture_output=True,
                          text=True, cwd=cwd or IMPL, timeout=180,
                          env={**os.environ, "PYTHONPATH": str(SRC)})


def test_json_is_one_document_when_the_target_prints_at_import_and_per_call():
    proc = command("check", "attention", "targets.py:attention_printing_unscaled", "--json")
    report = json.loads(proc.stdout)  # nothing but the report on stdout
    assert proc.returncode == 1 and report["findings"][0]["code"] == "wrong-scale"
    assert "hello from the user's file" in proc.stderr
    assert "attention called with" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert_reproducer_fails(report["findings"][0]["reproducer"], cwd=IMPL)


def test_json_is_one_document_when_the_target_writes_to_file_descriptor_1():
    proc = command("check", "softmax", "targets.py:softmax_writes_to_fd1", "--json")
    report = json.loads(proc.stdout)
    assert [f["code"] for f in report["findings"]] == ["nan-or-inf"]
    assert "written to fd 1" in proc.stderr


@pytest.mark.parametrize("argv, words", [
    (["multi-head", "orders.py:RaisesInInit"], "this module needs a GPU build"),
    (["multi-head", "orders.py:NeedsVocabulary"], "def make(E, H)"),
    (["multi-head", "orders.py:KeywordOnlyForward"], "takes 1 positional argument"),
    (["attention", "broken_import.py:attention"],
     "importing broken_import.py raised RuntimeError: set the DATA_DIR"),
    (["attention", "targets.py:NeedsTemperature"], "temperature"),
])
def test_the_command_never_prints_a_traceback(argv, words):
    proc = command("check", *argv, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert [f["code"] for f in report["findings"]] == ["call-failed"]
    assert words in report["findings"][0]["message"]
    table = command("check", *argv)
    assert table.returncode == 1 and "call-failed" in table.stdout
    assert "Traceback" not in table.stderr


def test_the_table_says_how_the_class_was_built(capsys):
    code = main(["check", "multi-head", f"{IMPL}/orders.py:HeadsWidthKV"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "built as HeadsWidthKV(n_head=4, d_model=16, d_k=4, d_v=4, dropout=0.0)" in out


# -- notebooks ---------------------------------------------------------------------------------
def write_notebook(path: Path, cells: list[tuple[str, str]]) -> Path:
    nb = {"nbformat": 4, "nbformat_minor": 5, "metadata": {},
          "cells": [{"cell_type": kind, "metadata": {}, "source": src.splitlines(True),
                     **({"outputs": [], "execution_count": None} if kind == "code" else {})}
                    for kind, src in cells]}
    path.write_text(json.dumps(nb))
    return path


NOTEBOOK = [
    ("markdown", "# Softmax, by hand\n"),
    ("code", "%matplotlib inline\nimport numpy as np\n!pip install nothing\n"),
    ("code", "%%time\nthis is not Python\n"),
    ("code", "def softmax(x):\n    e = np.exp(x)\n    return e / e.sum(-1, keepdims=True)\n"),
    ("code", "print(softmax(np.ones(3)))\n"),
    ("code", "raise RuntimeError('a later cell that fails')\n"),
]


def test_a_notebook_target_runs_its_cells_until_the_name_is_defined(tmp_path):
    write_notebook(tmp_path / "notes.ipynb", NOTEBOOK)
    proc = command("check", "softmax", "notes.ipynb:softmax", "--json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["origin"] == "defined in cell 4 of notes.ipynb"
    assert [f["code"] for f in report["findings"]] == ["nan-or-inf"]
    repro = report["findings"][0]["reproducer"]
    assert "load_target('notes.ipynb:softmax')" in repro
    assert_reproducer_fails(repro, cwd=tmp_path)
    table = command("check", "softmax", "notes.ipynb:softmax", cwd=tmp_path)
    assert "defined in cell 4 of notes.ipynb" in table.stdout


def test_a_notebook_cell_that_raises_before_the_name_is_call_failed_naming_the_cell(tmp_path):
    cells = NOTEBOOK[:1] + [("code", "import numpy as np\nx = undefined_name\n")] + NOTEBOOK[3:]
    write_notebook(tmp_path / "broken.ipynb", cells)
    proc = command("check", "softmax", "broken.ipynb:softmax", "--json", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    finding = json.loads(proc.stdout)["findings"][0]
    assert finding["code"] == "call-failed"
    assert "cell 2 of broken.ipynb raised NameError" in finding["message"]


def test_a_notebook_function_checked_from_python_names_its_cell(tmp_path):
    write_notebook(tmp_path / "fixed.ipynb", [
        ("code", "import numpy as np\n"),
        ("code", "def softmax(x):\n    e = np.exp(x - x.max(-1, keepdims=True))\n"
                 "    return e / e.sum(-1, keepdims=True)\n")])
    report = check_softmax(load_target(f"{tmp_path}/fixed.ipynb:softmax"))
    assert report.ok and report.findings == [], report.table()
    assert report.seconds < 30
    assert report.origin == "defined in cell 2 of fixed.ipynb"
    with pytest.raises(ValueError, match="no code cell defines 'nothing'"):
        load_target(f"{tmp_path}/fixed.ipynb:nothing")


@pytest.mark.parametrize("check, spec", [
    ("attention", "targets.py:math"),  # a module, not a function
    ("attention", "targets.py:scaled.dropout"),  # a submodule that takes one input
    ("multi-head", "targets.py:attention_raises"),
    ("multi-head", "numpy_random.py:np"),
])
def test_whatever_the_target_is_the_command_reports_and_exits_1(check, spec):
    proc = command("check", check, spec, "--json")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    report = json.loads(proc.stdout)
    assert [f["code"] for f in report["findings"]] == ["call-failed"], report


def test_every_code_is_in_the_table_of_docs_check_md():
    from attnkit.check import CODES

    text = (Path(__file__).resolve().parents[2] / "docs" / "check.md").read_text()
    missing = [code for code in CODES if f"| `{code}` |" not in text]
    assert not missing, f"docs/check.md does not list {missing}"
