"""The `attnkit` command: demo, trace, help, option spellings and argument errors, end to end.

Also here: tests/cli/test_bench.py (`attnkit bench`), test_trace.py (the shape trace),
test_train.py (`attnkit train`, needs torch).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnkit import cli
from attnkit.cli import build_parser, main
from attnkit.train_config import MODELS, TASKS, TrainConfig

SRC = str(Path(__file__).resolve().parents[2] / "src")


def run_module(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    env["MPLBACKEND"] = ""  # no backend chosen: the figures must not need one
    return subprocess.run([sys.executable, *args], capture_output=True, text=True,
                          env=env, timeout=timeout)


def test_python_m_attnkit_help_in_a_real_process():
    proc = run_module("-m", "attnkit", "--help")
    assert proc.returncode == 0, proc.stderr
    for command in ("demo", "train", "trace", "bench"):
        assert command in proc.stdout
    assert proc.stderr == ""


@pytest.mark.parametrize("command", ["demo", "train", "trace", "bench", "view"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: attnkit {command}")
    assert "--" in out  # documents its options


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["train", "--steps", "-3"], "--steps: expected a positive integer, got -3"),
        (["train", "--steps", "ten"], "--steps: expected a positive integer"),
        (["train", "--task", "shuffle"], "invalid choice: 'shuffle'"),
        (["train", "--model", "rnn"], "invalid choice: 'rnn'"),
        (["train", "--lr", "nan"], "--lr: expected a positive number"),
        (["train", "--model", "mha", "--hidden", "30", "--num-heads", "4"],
         "--hidden 30 must be a multiple of --num-heads 4"),
        (["train", "--seq-len", "3", "--eval-size", "600"],
         "--seq-len 3 allows only 1000 sequences: holding out --eval-size 600"),
        (["trace", "--embed-dim", "36", "--num-heads", "5"],
         "--embed-dim 36 is not a multiple of --num-heads 5; pass --head-dim"),
        (["trace", "--num-heads", "5", "--kv-heads", "2"],
         "--num-heads 5 must be a positive multiple of --kv-heads 2"),
        (["trace", "--seq-len", "0"], "--seq-len: expected a positive integer, got 0"),
        (["bench", "--timeout", "-1"], "--timeout: expected a positive number"),
        (["bench", "--dir", "no/such/folder"], "--dir no/such/folder: no such folder"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        ([], "required: COMMAND"),
    ],
)
def test_bad_arguments_give_one_line_and_exit_2(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1, captured.err
    assert "error:" in lines[0] and fragment in lines[0]
    assert "Traceback" not in captured.err and captured.out == ""
    assert not re.search(r"\b[a-z]+_[a-z_]+\b", lines[0]), "a parameter name, not its flag"


TRAIN_FIELDS = [f.name for f in dataclasses.fields(TrainConfig)]


@pytest.mark.parametrize("bad", [
    {"task": "shuffle"}, {"model": "rnn"}, {"steps": 0}, {"length": 0}, {"batch_size": 0},
    {"hidden": 0}, {"num_heads": 0}, {"eval_size": 0}, {"threads": 0}, {"lr": math.nan},
    {"model": "mha", "hidden": 6}, {"length": 3, "eval_size": 1000},
])
def test_every_train_config_error_names_flags(bad, capsys):
    """Even the errors argparse's own types catch first: TrainConfig names a field as
    ``name=value`` and `attnkit train` turns every one into its flag."""
    with pytest.raises(ValueError) as err:
        TrainConfig(**bad)
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    with pytest.raises(SystemExit):
        cli._flag_error(train, str(err.value))
    line = capsys.readouterr().err
    assert "--" in line.split("(see:")[0]
    for name in TRAIN_FIELDS:
        assert f"{name}=" not in line and ("_" not in name or name not in line), line


def test_train_defaults_are_train_configs():
    args = build_parser().parse_args(["train"])
    assert {name: getattr(args, name) for name in TRAIN_FIELDS} == dataclasses.asdict(
        TrainConfig()
    )
    actions = {a.dest: a for a in build_parser()._subparsers._group_actions[0]
               .choices["train"]._actions}
    assert tuple(actions["task"].choices) == TASKS and tuple(actions["model"].choices) == MODELS


def test_help_and_train_argument_errors_need_no_torch():
    code = textwrap.dedent("""
        import sys
        from attnkit.cli import main
        for argv in (["--help"], ["train", "--help"], ["train", "--hidden", "30",
                     "--model", "mha", "--num-heads", "4"]):
            try:
                main(argv)
            except SystemExit:
                pass
        assert "torch" not in sys.modules, "imported torch"
    """)
    proc = run_module("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "--hidden 30 must be a multiple of --num-heads 4" in proc.stderr


# -- one spelling per concept; the old spellings keep working, hidden and warned about ------
def _options(command: str) -> dict[str, str]:
    """``{flag: help}`` of a subcommand's visible options."""
    sub = build_parser()._subparsers._group_actions[0].choices[command]
    return {flag: a.help for a in sub._actions for flag in a.option_strings
            if a.help != "==SUPPRESS=="}


def test_shared_concepts_are_spelled_the_same_in_train_and_trace():
    train, trace = _options("train"), _options("trace")
    for flag in ("--num-heads", "--batch-size", "--seq-len", "--seed"):
        assert flag in train and flag in trace, flag


@pytest.mark.parametrize("command, old, new, dest, value", [
    ("train", "--heads", "--num-heads", "num_heads", 8),
    ("train", "--length", "--seq-len", "length", 7),
    ("trace", "--batch", "--batch-size", "batch", 2),
    ("trace", "--seq", "--seq-len", "seq", 5),
    ("trace", "--kv-seq", "--kv-seq-len", "kv_seq", 4),
])
def test_old_spelling_is_a_hidden_deprecated_alias(command, old, new, dest, value, capsys):
    args = build_parser().parse_args([command, old, str(value)])
    assert getattr(args, dest) == value
    assert capsys.readouterr().err == (
        f"attnkit {command}: warning: {old} is deprecated; use {new}\n"
    )
    assert getattr(build_parser().parse_args([command, new, str(value)]), dest) == value
    assert capsys.readouterr().err == ""
    assert new in _options(command) and old not in _options(command)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = capsys.readouterr().out
    assert f"{new} " in out and f"{old} " not in out


@pytest.mark.parametrize("command", ["demo", "train"])
def test_unusable_out_folder_is_one_line_before_any_work(command, tmp_path, capsys):
    """--out under a regular file: an argument error up front, not a traceback after the
    demo or a whole training run."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(SystemExit) as exc:
        main([command, "--out", str(blocker / "figures")])
    assert exc.value.code == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and "--out" in lines[0] and str(blocker) in lines[0], captured.err
    assert "Traceback" not in captured.err and captured.out == ""


def test_demo_writes_figures_without_torch(tmp_path, check_png):
    """The demo needs NumPy and matplotlib only: run it where torch was never imported."""
    out = tmp_path / "demo"
    code = textwrap.dedent(f"""
        import sys
        from attnkit.cli import main
        rc = main(["demo", "--out", {str(out)!r}])
        assert "torch" not in sys.modules, "the demo imported torch"
        sys.exit(rc)
    """)
    proc = run_module("-c", code)
    assert proc.returncode == 0, proc.stderr
    written = [line.split("wrote ", 1)[1] for line in proc.stdout.splitlines()
               if "wrote " in line]
    assert len(written) == 6
    assert sorted(Path(p).name for p in written) == sorted(p.name for p in out.iterdir())
    *figures, page = written
    for path in figures:
        check_png(path)
    # The last step is the explorer page of a model trained there and then: it learned.
    assert page.endswith("06_explore_reverse.html")
    assert "held-out accuracy 1.00" in Path(page).read_text()
    text = proc.stdout
    assert "naive [nan nan nan]" in text  # the overflow counter-example
    assert "[[2.0, 3.0, 4.0, 5.0], [10.0, 11.0, 12.0, 13.0]]" in text  # d2l's outputs
    assert "(3, 5, 11, 7)" in text and "(3, 5, 11, 11)" in text  # the MHA shape trace


def test_trace_needs_numpy_only():
    code = ("import sys; from attnkit.cli import main; rc = main(['trace']); "
            "assert not {'matplotlib', 'torch'} & set(sys.modules), 'imported too much'; "
            "sys.exit(rc)")
    proc = run_module("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert "(3, 5, 11, 11)" in proc.stdout


def test_trace_prints_every_step(capsys):
    assert main(["trace"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "(3, 11, 35)" in rows["query"] and "(3, 11, 35)" in rows["output"]
    assert "(5, 35, 7)" in rows["W_q"]
    assert "(3, 5, 11, 7)" in rows["q"] and "(3, 5, 11, 11)" in rows["scores"]


def test_trace_cross_attention_gqa_free_head_dim(capsys):
    argv = ["trace", "--embed-dim", "36", "--num-heads", "6", "--kv-heads", "2",
            "--head-dim", "5", "--batch-size", "2", "--seq-len", "3", "--kv-seq-len", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "(2, 6, 3, 5)" in rows["q"] and "(2, 2, 4, 5)" in rows["k"]
    assert "(2, 6, 3, 4)" in rows["weights"] and "(2, 3, 30)" in rows["concat"]
    assert "(2, 3, 36)" in rows["output"]


def test_view_writes_a_page_from_saved_weights(tmp_path, capsys):
    import numpy as np

    from attnkit.viz import explore

    weights = np.random.default_rng(0).random((2, 3, 4, 4))
    src = tmp_path / "w.npz"
    explore(weights, list("abcd")).save_npz(src)
    assert main(["view", str(src), "--out", str(tmp_path / "out")]) == 0
    page = tmp_path / "out" / "w.html"
    assert page.is_file() and "<canvas" in page.read_text()
    assert "w.html" in capsys.readouterr().out


def test_view_of_a_missing_file_names_it(tmp_path, capsys):
    missing = tmp_path / "nope.npz"
    with pytest.raises(SystemExit) as exit_:
        main(["view", str(missing), "--out", str(tmp_path)])
    assert exit_.value.code == 2
    assert "nope.npz" in capsys.readouterr().err
