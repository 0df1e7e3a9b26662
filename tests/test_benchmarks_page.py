"""BENCHMARKS.md is the current state built from the recorded runs
(benchmarks/results.jsonl) by `python tools/benchmarks_page.py`: the page in the repository
is what the command gives, every record has its context, every table on the page names the
command and date that produced it, and the benchmark scripts record through
benchmarks/_report.py instead of appending Markdown."""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


page = _load("_benchmarks_page_under_test", ROOT / "tools" / "benchmarks_page.py")
DATE = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC")


def test_the_page_is_what_the_command_builds_from_the_records():
    records = page.load_records(page.RECORDS)
    want = page.build_page(records, page.page_plots())
    assert page.PAGE.read_text() == want, (
        "BENCHMARKS.md is stale: run `python tools/benchmarks_page.py`")
    assert page.main(["--check"]) == 0
    for name in page.page_plots():
        assert f"](docs/img/benchmarks/{name})" in want
    assert set(page.page_plots()) == set(page.PLOT_ALT)  # both plots are committed


def test_every_record_parses_and_has_its_context():
    lines = [ln for ln in page.RECORDS.read_text().splitlines() if ln.strip()]
    records = page.load_records(page.RECORDS)
    assert len(records) == len(lines) >= 74  # the history of the old log, and later runs
    for rec in records:
        assert list(rec) == list(page.FIELDS)
        assert DATE.fullmatch(rec["date"])
        assert rec["machine"] and rec["versions"].startswith("python ")
        assert re.match(r"python[\d.]* \S", rec["command"]), rec["command"]
        assert rec["rows"] and all(len(r) == len(rec["columns"]) for r in rec["rows"])


def test_the_page_fits_a_few_screens():
    assert len(page.PAGE.read_bytes()) < 16_000
    assert page.PAGE.read_text().count("\n## ") < 25


def test_every_table_on_the_page_names_its_command_and_date():
    text = page.PAGE.read_text()
    sections = re.split(r"^## ", text, flags=re.M)[1:]
    tables = 0
    for section in sections:
        lines = section.splitlines()
        n = 0
        while n < len(lines):
            if not lines[n].startswith("|"):
                n += 1
                continue
            end = n
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            before = "\n".join(lines[:n])
            header = [c.strip() for c in lines[n].strip("|").split("|")]
            if header[0] == "run":  # rows from several runs: each run number is listed
                runs = {ln.split("|")[1].strip() for ln in lines[n + 2:end]}
                for r in runs:
                    item = re.search(rf"^{r}\. (.*)$", before, flags=re.M)
                    assert item and DATE.search(item.group(1)), (lines[0], r)
                    assert re.search(r"`python[\d.]* [^`]+`", item.group(1)), (lines[0], r)
            else:
                assert DATE.search(before), lines[0]
                assert re.search(r"`python[\d.]* [^`]+`", before), lines[0]
            tables += 1
            n = end
    assert tables >= 15


def test_a_stale_page_fails_the_check(tmp_path, monkeypatch, capsys):
    records = tmp_path / "results.jsonl"
    records.write_text(page.RECORDS.read_text())
    monkeypatch.setattr(page, "RECORDS", records)
    monkeypatch.setattr(page, "PAGE", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(page, "IMAGES", tmp_path / "img")
    page.PAGE.write_text(page.build_page(page.load_records(records)))
    assert page.main(["--check"]) == 0
    rec = page.make_record("numpy-vs-sdpa", "NumPy attention on the CPU vs torch SDPA (float32)",
                           "2099-01-01 00:00 UTC", "m", "python 3", "python benchmarks/x.py",
                           ["T", "op", "vs torch"], [[64, "numpy flash", 9.5]])
    page.append_record(rec, records)
    assert page.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().err


def test_the_latest_run_wins_and_older_rows_fill_in():
    def run(date, rows, command="python b.py"):
        return page.make_record("q", "t", date, "m", "python 3", command, ["case", "x"], rows)

    runs = page.latest_first([
        run("2026-01-02 00:00 UTC", [["a", 1.0], ["b", 2.0], ["c", 3.0]], "python b.py --all"),
        run("2026-01-03 00:00 UTC", [["a", 1.5]]),
        run("2026-01-01 00:00 UTC", [["d", 4.0]]),
    ])
    groups = page.current_rows(runs, key=1)
    assert [(g[0]["date"][:10], g[1]) for g in groups] == [
        ("2026-01-03", [["a", 1.5]]), ("2026-01-02", [["b", 2.0], ["c", 3.0]]),
        ("2026-01-01", [["d", 4.0]])]
    text = page.build_page(runs)
    assert "1. 2026-01-03 00:00 UTC, `python b.py`" in text
    assert "2. 2026-01-02 00:00 UTC, `python b.py --all`" in text
    assert "| 1 | a | 1.5 |" in text and "| 2 | c | 3 |" in text


def test_a_retired_row_is_history_not_a_current_figure():
    """A row the benchmark split or renamed stays in --history, off the page and plots."""
    def run(date, rows):
        return page.make_record("torch-vs-sdpa", "t", date, "m", "python 3", "python b.py",
                                ["case", "ratio"], rows)

    old = "MHA decode step Tk=160 E=512 H=8 B=4, padding"
    runs = page.latest_first([
        run("2026-01-01 00:00 UTC", [[old, 1.16], ["a", 1.2]]),
        run("2026-01-02 00:00 UTC", [[old + " (valid_lens)", 1.04]]),
    ])
    assert old in page.BY_ID["torch-vs-sdpa"].retired
    assert page.current_rows(runs, 1, page.BY_ID["torch-vs-sdpa"].retired) == [
        (runs[0], [[old + " (valid_lens)", 1.04]]), (runs[1], [["a", 1.2]])]
    assert f"| {old} |" not in page.build_page(runs)
    assert old in page.history(runs, "torch-vs-sdpa")


def test_the_old_markdown_log_becomes_records():
    log = textwrap.dedent("""\
        # Benchmarks

        ## Packed documents, attnkit segment_ids vs SDPA with a dense mask (CPU, T=64)

        - date: 2026-11-22 21:59 UTC
        - machine: AMD EPYC, 2 cores
        - versions: python 3.11.7, numpy 2.4.6
        - command: `python benchmarks/packed_cpu.py` (run by hand)

        | case      | SDPA+mask ms | speed-up | max |err| |
        |-----------|--------------|----------|-----------|
        | full, fwd | 7161.3       | 4.68     | 2.0e-07   |

        Median of 3.
        ## A one-off study

        - date: 2026-11-25 23:36 - 2026-11-26 00:08 UTC
        - machine: a laptop
        - versions: python 3.12
        - before: commit 4f17de9;
          after: this branch.

        `python benchmarks/numpy_cpu.py --ops flash`, paired ratios:

        | run | ratio |
        |-----|-------|
        | one | 1.41  |
    """)
    a, b = page.parse_markdown_log(log)
    assert a["question"] == "packed" and a["command"] == "python benchmarks/packed_cpu.py"
    assert a["columns"] == ["case", "SDPA+mask ms", "speed-up", "max |err|"]
    assert a["rows"] == [["full, fwd", 7161.3, 4.68, 2e-07]]
    assert a["notes"] == "command: (run by hand)\n\nMedian of 3."
    assert b["date"] == "2026-11-26 00:08 UTC" and b["machine"] == "a laptop"
    assert b["command"] == "python benchmarks/numpy_cpu.py --ops flash"
    assert "ran 2026-11-25 23:36 - 2026-11-26 00:08 UTC" in b["notes"]
    assert "before: commit 4f17de9; after: this branch." in b["notes"]
    assert b["rows"] == [["one", 1.41]]
    for rec in (a, b):
        page.check_record(json.loads(json.dumps(rec)))


def test_importing_a_log_twice_appends_its_runs_once(tmp_path):
    log = tmp_path / "old.md"
    records = tmp_path / "results.jsonl"
    log.write_text("# Benchmarks\n\n## Ring attention on CPU with gloo (CPU)\n\n"
                   "- date: 2026-11-22 09:09 UTC\n- machine: m\n- versions: python 3\n"
                   "- command: `python benchmarks/ring.py`\n\n| a | b |\n|---|---|\n"
                   "| x | 1 |\n")
    assert page.import_markdown(log, records) == 1
    assert page.import_markdown(log, records) == 0
    (rec,) = page.load_records(records)
    assert rec["rows"] == [["x", 1]] and rec["notes"] == ""


@pytest.mark.parametrize(("question", "date", "row", "column", "value"), [
    # figures as the appended log printed them before it became records
    ("numpy-vs-sdpa", "2026-11-22 08:32 UTC", (4096, "numpy flash"), "vs torch", 1.39),
    ("numpy-vs-sdpa", "2026-11-26 01:26 UTC", (4096, "numpy flash"), "torch (ms)", 440),
    ("transformers-vs-sdpa", "2026-11-26 00:34 UTC",
     ("generate 64 tokens, B=4 left-padded prompts 40/64/90/128",), "ratio", 1.071),
    ("torch-vs-sdpa", "2026-11-26 01:07 UTC", ("decode Tq=1 Tk=160, padding",), "ratio", 1.28),
    ("torch-vs-sdpa", "2026-11-26 01:07 UTC",
     ("MHA decode step Tk=4096 E=512 H=8 B=4, padding",), "peer ms", 5.072),
    ("ring-gloo", "2026-11-22 09:09 UTC", ("causal, zigzag",), "speedup (ideal 2x)", "2.40x"),
    ("precision-blockwise", "2026-11-22 22:10 UTC", ("q x20, Dk=59, Tk=45", "numpy flash"),
     "dk", "3.4e-05 (1.2x)"),
    ("numpy-loop-split", "2026-11-26 00:08 UTC", ("--threads 1, pair 2 (~7)",),
     "T=4096 after", 1.28),
])
def test_recorded_history_spot_checks(question, date, row, column, value):
    runs = [r for r in page.load_records(page.RECORDS)
            if r["question"] == question and r["date"] == date]
    assert len(runs) == 1, (question, date)
    rec = runs[0]
    match = [r for r in rec["rows"] if tuple(r[:len(row)]) == row]
    assert len(match) == 1
    assert match[0][rec["columns"].index(column)] == value


def test_report_records_a_run_and_rebuilds_the_page(tmp_path, monkeypatch, capsys):
    report = _load("_benchmarks_report_under_test", ROOT / "benchmarks" / "_report.py")
    monkeypatch.setattr(report, "RESULTS", tmp_path / "results.jsonl")
    monkeypatch.setattr(report, "BENCHMARKS_MD", tmp_path / "BENCHMARKS.md")
    monkeypatch.setattr(report, "IMAGES", tmp_path / "img")
    monkeypatch.setattr(report, "page_tool", lambda: page)
    monkeypatch.setattr(sys, "argv", ["benchmarks/fancy.py", "--threads", "1"])
    report.report("Fancy kernel vs SDPA (CPU)", ["case", "ms", "ratio"],
                  [["a", "0.083", 1.0], ["b", float("nan"), 1.25]], notes="One note.")
    report.report("Fancy kernel vs SDPA (CPU)", ["case", "ms"], [["a", 1]], record=False)
    (rec,) = page.load_records(tmp_path / "results.jsonl")
    assert rec["question"] == "fancy-kernel-vs-sdpa" and rec["notes"] == "One note."
    assert rec["command"].endswith(" benchmarks/fancy.py --threads 1")
    assert rec["rows"] == [["a", 0.083, 1.0], ["b", "nan", 1.25]]
    assert DATE.fullmatch(rec["date"]) and rec["versions"].startswith("python ")
    text = (tmp_path / "BENCHMARKS.md").read_text()
    assert "## Fancy kernel vs SDPA (CPU)" in text and "| b | nan | 1.25 |" in text
    assert "benchmarks/fancy.py --threads 1`" in text
    assert "rebuilt" in capsys.readouterr().out


def test_history_prints_every_run_of_a_question(capsys):
    assert page.main(["--history", "transformers-vs-sdpa"]) == 0
    out = capsys.readouterr().out
    runs = [r for r in page.load_records() if r["question"] == "transformers-vs-sdpa"]
    assert len(runs) >= 7  # the history kept every run the old log had
    assert out.count("\n## attnkit as a transformers attn_implementation") + 1 == len(runs)
    assert "- command: `python benchmarks/transformers_cpu.py --repeats 25`" in out
    assert page.main(["--history", "no-such-question"]) == 2
    assert "recorded questions:" in capsys.readouterr().err
