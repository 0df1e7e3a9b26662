"""`attnkit check`: the table, --json, --convention, the exit status, bad targets."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from attnkit.cli import main  # noqa: E402

EX = Path(__file__).resolve().parents[2] / "examples" / "check"


def test_a_clean_function_exits_0_with_a_table(capsys):
    assert main(["check", "attention", f"{EX}/attention_fixed.py:attention"]) == 0
    out = capsys.readouterr().out
    assert "framework numpy, convention none" in out and "OK: 0 error(s)" in out


def test_an_error_finding_exits_1_and_json_carries_it(capsys):
    code = main(["check", "attention", f"{EX}/attention_bugs.py:attention_fill_1e9",
                 "--convention", "masked", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["ok"] is False
    assert report["convention"] == "masked (declared)"
    codes = {f["code"]: f["severity"] for f in report["findings"]}
    assert codes == {"float16-overflow": "error", "fully-masked-row": "warning"}
    assert all(f["reproducer"] and f["message"] and f["measured"] for f in report["findings"])


def test_multi_head_and_module_path_targets(capsys):
    assert main(["check", "multi-head", "attnkit.torch:MultiHeadAttention"]) == 0
    assert "convention valid_lens" in capsys.readouterr().out
    assert main(["check", "multi-head", f"{EX}/modules.py:PlainListProjections"]) == 1
    assert "unregistered-parameter" in capsys.readouterr().out


@pytest.mark.parametrize("argv, words", [
    (["check", "attention", "no_such_file.py:fn"], "no such file"),
    (["check", "attention", "attnkit.numpy"], "expected FILE.py:NAME"),
    (["check", "attention", "attnkit.numpy:nope"], "has no attribute 'nope'"),
    (["check", "softmax", "attnkit.numpy:softmax", "--convention", "masked"], "takes no mask"),
])
def test_bad_arguments_are_one_line_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_checking_numpy_code_needs_no_torch():
    """attnkit.check and the command import torch only for PyTorch code (NumPy users may not
    have it installed)."""
    import subprocess
    import sys

    code = ("import sys, attnkit.check, attnkit.cli; "
            "from attnkit.check import check_softmax; import attnkit.numpy as n; "
            "assert check_softmax(n.softmax).ok; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    src = str(Path(__file__).resolve().parents[2] / "src")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={"PYTHONPATH": src, "PATH": ""}, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_a_printed_reproducer_run_as_a_script_shows_the_bug(capsys, tmp_path):
    """The reproducer of `attnkit check ... --json`, saved to a file and run by Python, ends
    in the AssertionError that names the bug."""
    import subprocess
    import sys

    root = EX.parents[1]
    assert main(["check", "attention", f"{EX}/attention_bugs.py:attention_unscaled",
                 "--json"]) == 1
    finding = json.loads(capsys.readouterr().out)["findings"][0]
    script = tmp_path / "repro.py"
    script.write_text(finding["reproducer"])
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          cwd=root, env={"PYTHONPATH": str(root / "src"), "PATH": ""},
                          timeout=120)
    assert proc.returncode == 1 and "AssertionError" in proc.stderr, proc.stderr
    assert "1/sqrt(Dk)" in proc.stderr and "max error against the oracle" in proc.stdout
