"""The `attnkit` command: demo, trace, bench, help and argument errors, end to end."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnkit.cli import Progress, main

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


@pytest.mark.parametrize("command", ["demo", "train", "trace", "bench"])
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
        (["train", "--model", "mha", "--hidden", "30", "--heads", "4"],
         "hidden=30 must be a multiple of num_heads=4"),
        (["trace", "--embed-dim", "36", "--num-heads", "5"], "not a multiple of num_heads=5"),
        (["trace", "--num-heads", "5", "--kv-heads", "2"], "num_heads=5 must be a multiple"),
        (["trace", "--seq", "0"], "--seq: expected a positive integer, got 0"),
        (["bench", "--timeout", "-1"], "--timeout: expected a positive number"),
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
    assert len(written) == 5
    assert sorted(Path(p).name for p in written) == sorted(p.name for p in out.iterdir())
    for path in written:
        check_png(path)
    text = proc.stdout
    assert "naive [nan nan nan]" in text  # the overflow counter-example
    assert "[[2.0, 3.0, 4.0, 5.0], [10.0, 11.0, 12.0, 13.0]]" in text  # d2l's outputs
    assert "(3, 5, 11, 7)" in text and "(3, 5, 11, 11)" in text  # seed 001's trace


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
            "--head-dim", "5", "--batch", "2", "--seq", "3", "--kv-seq", "4"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert "(2, 6, 3, 5)" in rows["q"] and "(2, 2, 4, 5)" in rows["k"]
    assert "(2, 6, 3, 4)" in rows["weights"] and "(2, 3, 30)" in rows["concat"]
    assert "(2, 3, 36)" in rows["output"]


# -- bench -----------------------------------------------------------------------------------
def _write(folder: Path, name: str, body: str) -> None:
    (folder / name).write_text(textwrap.dedent(body))


def test_bench_runs_scripts_quick_and_reports_failures(tmp_path, capsys):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "_report.py", "raise SystemExit('helpers are not run')\n")
    _write(bench, "bench_ok.py", """
        import sys
        assert sys.argv[1:] == ["--quick"], sys.argv
        import attnkit  # the scripts see the same attnkit as the command
        print("| size | ms |")
        print("| 64   | 1.0 |")
    """)
    _write(bench, "bench_broken.py", "raise RuntimeError('kernel exploded')\n")
    rc = main(["bench", "--quick", "--dir", str(bench)])
    out = capsys.readouterr().out
    assert rc == 1
    assert "| 64   | 1.0 |" in out
    assert "kernel exploded" in out
    assert "bench_broken.py: FAILED (exit 1)" in out and "bench_ok.py: ok" in out
    assert "_report" not in out
    assert out.rstrip().splitlines()[-1] == "bench: 1/2 scripts ok; failed: bench_broken.py"


def test_bench_all_ok_exits_zero_and_only_filters(tmp_path, capsys):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "bench_a.py", "print('table a')\n")
    _write(bench, "bench_b.py", "raise SystemExit(3)\n")
    assert main(["bench", "--quick", "--dir", str(bench), "--only", "bench_a"]) == 0
    out = capsys.readouterr().out
    assert "table a" in out and "bench_b" not in out


def test_bench_kills_a_script_past_its_timeout(tmp_path, capsys):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "bench_slow.py", "import time\nprint('started', flush=True)\ntime.sleep(30)\n")
    assert main(["bench", "--dir", str(bench), "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert "started" in out and "TIMED OUT after 1 s" in out


def test_bench_without_folder_is_one_clear_line(tmp_path, capsys):
    rc = main(["bench", "--quick", "--dir", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert rc == 1
    assert len(err.splitlines()) == 1 and "no benchmarks/ folder" in err


# -- progress bar ----------------------------------------------------------------------------
class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    bar = Progress(200, stream=stream, lines=4)
    for step in range(1, 201):
        bar.update(step, 1.0 / step)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 4
    assert lines[-1].startswith("step 200/200 [") and "loss 0.0050" in lines[-1]
    assert "steps/s" in lines[-1] and "eta" in lines[-1]


def test_progress_redraws_one_line_on_a_tty():
    stream = _Tty()
    bar = Progress(5, stream=stream)
    for step in range(1, 6):
        bar.update(step, 0.5)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\rstep 1/5") and text.endswith("\n")
    assert text.count("\n") == 1  # one line, redrawn in place
    assert "step 5/5 [" + "#" * 24 + "]" in text
