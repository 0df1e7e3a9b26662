"""`attnkit bench`: runs the repository's benchmark scripts (attnkit.bench), and says what to
do where there are none (a pip install)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from attnkit import bench as runner
from attnkit.cli import main


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


def test_bench_skips_a_script_whose_extra_is_missing(tmp_path, capsys):
    """A missing optional module gives one line naming the extra and no traceback, whether
    the script imports it itself or attnkit does deep inside; the run still exits 0. An
    ImportError that an extra would not fix is a failure, as before."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "needs_transformers.py", """
        import sys
        sys.modules["transformers"] = None  # what an absent package looks like to import
        print("started")
        import transformers
    """)
    _write(bench, "needs_triton_inside.py", """
        import sys
        sys.modules["triton"] = None
        from attnkit.triton import decode_attention
    """)
    _write(bench, "broken_import.py", "from numpy import no_such_function\n")
    rc = main(["bench", "--quick", "--dir", str(bench), "--only", "needs_"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "started" in out and "Traceback" not in out
    assert ("== needs_transformers.py: skipped, needs transformers, which is not installed: "
            "pip install 'attnkit[transformers]'") in out
    assert ("== needs_triton_inside.py: skipped, needs triton, which is not installed: "
            "pip install 'attnkit[triton]'") in out
    assert out.rstrip().splitlines()[-1] == (
        "bench: 0/2 scripts ok; skipped (missing extra): needs_transformers.py, "
        "needs_triton_inside.py")
    assert main(["bench", "--dir", str(bench), "--only", "broken_import"]) == 1
    out = capsys.readouterr().out
    assert "broken_import.py: FAILED (exit 1)" in out and "no_such_function" in out


def test_bench_kills_a_script_past_its_timeout(tmp_path, capsys):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "bench_slow.py", "import time\nprint('started', flush=True)\ntime.sleep(30)\n")
    assert main(["bench", "--dir", str(bench), "--timeout", "1"]) == 1
    out = capsys.readouterr().out
    assert "started" in out and "TIMED OUT after 1 s" in out


def test_bench_from_a_pip_install_says_what_to_do(tmp_path, capsys, monkeypatch):
    """An installed package has no benchmarks/ beside it: one line that says where it looked
    and how to run the scripts (from a clone, or with --dir)."""
    monkeypatch.setattr(runner, "PACKAGE", tmp_path / "site-packages" / "attnkit")
    monkeypatch.chdir(tmp_path)
    assert runner.find_benchmarks() is None
    rc = main(["bench", "--quick"])
    err = capsys.readouterr().err
    assert rc == 1
    assert len(err.splitlines()) == 1 and "no benchmarks/ folder" in err
    assert str(tmp_path / "benchmarks") in err
    assert "source repository" in err and "attnkit bench --dir" in err


def test_bench_only_matching_nothing_names_the_flag(tmp_path, capsys):
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    _write(bench, "bench_a.py", "print('table a')\n")
    with pytest.raises(SystemExit) as exc:
        main(["bench", "--dir", str(bench), "--only", "zzz"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "--only zzz: no script in" in err


def test_find_benchmarks_in_a_source_checkout():
    assert runner.find_benchmarks() == Path(__file__).resolve().parents[2] / "benchmarks"


_FOLDER = runner.find_benchmarks()
SCRIPTS = [p.name for p in runner.select_scripts(_FOLDER)] if _FOLDER else []


def test_the_repository_has_benchmark_scripts():
    assert len(SCRIPTS) >= 5, SCRIPTS


# One test per script, so that `make test`'s workers share them (all in one test, they were
# the suite's longest test by far).
@pytest.mark.timeout(400)
@pytest.mark.parametrize("script", SCRIPTS)
def test_every_benchmark_runs_at_smoke_sizes(script, capsys):
    """Every script of the repository's benchmarks/ at its smallest sizes (``--smoke``):
    each exits 0, or is skipped with one line where its extra is not installed, and none
    records a run (benchmarks/results.jsonl) or rewrites BENCHMARKS.md or its plots. A
    library change that breaks a benchmark fails here."""
    folder = _FOLDER
    kept = [folder / "results.jsonl", folder.parent / "BENCHMARKS.md",
            *sorted((folder.parent / "docs" / "img" / "benchmarks").glob("*.png"))]
    before = [p.read_bytes() if p.exists() else None for p in kept]
    rc = main(["bench", "--smoke", "--timeout", "180", "--only", script])
    out = capsys.readouterr().out
    assert rc == 0, out[-4000:]
    assert (f"== {script}: ok in" in out
            or f"== {script}: skipped, needs" in out), (script, out[-4000:])
    assert re.search(r"^bench: \d+/1 scripts", out, re.M), out[-4000:]  # this one alone
    assert [p.read_bytes() if p.exists() else None for p in kept] == before
