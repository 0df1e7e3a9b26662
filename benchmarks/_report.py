"""Shared benchmark plumbing: timing, a printed table, and a record of each run.

Every benchmark script reports ratios against a peer measured in the same run; this
module records each table with its context (date, machine, versions, exact command) as one
JSON line in ``benchmarks/results.jsonl`` (the history), then rebuilds ``BENCHMARKS.md``,
the current state, from those records (``tools/benchmarks_page.py``).
"""

from __future__ import annotations

import datetime as _dt
import importlib.util
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results.jsonl"  # the history: one JSON line per table
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"  # the current state, built from RESULTS
IMAGES = ROOT / "docs" / "img" / "benchmarks"  # its plots


def median_time(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def machine() -> str:
    """One line describing the machine: CPU, core count, and the GPU when there is one."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    desc = f"{cpu}, {os.cpu_count()} cores"
    try:
        import torch

        if torch.cuda.is_available():
            desc += f", GPU {torch.cuda.get_device_name()}"
    except ImportError:
        pass
    return desc


def versions() -> str:
    """``python X, numpy Y, torch Z, triton W`` (those installed), and transformers when
    the script imported it."""
    parts = [f"python {platform.python_version()}"]
    for mod in ("numpy", "torch", "triton"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            pass
    if "transformers" in sys.modules:
        parts.append(f"transformers {sys.modules['transformers'].__version__}")
    return ", ".join(parts)


def page_tool():
    """``tools/benchmarks_page.py`` as a module (the record format and the page builder)."""
    name = "_attnkit_benchmarks_page"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / "benchmarks_page.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (also readable when printed)."""
    cells = [[str(h) for h in headers]] + [[_fmt(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def _fmt(c: object) -> str:
    if isinstance(c, float):
        return f"{c:.3g}" if abs(c) < 1e4 else f"{c:.0f}"
    return str(c)


def report(
    title: str,
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    *,
    notes: str = "",
    record: bool = True,
    question: str | None = None,
) -> str:
    """Print the table and, when ``record``, record it and rebuild the page.

    The record (one JSON line appended to :data:`RESULTS`) holds ``question`` (None: read
    off the title by ``tools/benchmarks_page.py``), the title, the date, :func:`machine`,
    :func:`versions`, the exact command, the columns, the rows as values and the notes;
    then :data:`BENCHMARKS_MD` and its plots are rebuilt from every record.

    Returns:
        The printed Markdown table.
    """
    table = format_table(headers, rows)
    print(f"\n{title}\n{table}")
    if notes:
        print(notes)
    if record:
        page = page_tool()
        command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        rec = page.make_record(question or page.question_of(title), title, stamp, machine(),
                               versions(), command, headers, rows, notes)
        page.append_record(rec, RESULTS)
        page.write_page(RESULTS, BENCHMARKS_MD, IMAGES)
        print(f"(recorded in {RESULTS.name}; {BENCHMARKS_MD.name} rebuilt)")
    return table
