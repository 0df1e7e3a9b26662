"""Shared benchmark plumbing: timing, a printed table, and an entry appended to BENCHMARKS.md.

Every benchmark script reports ratios against a peer measured in the same run; this
module records the context (date, machine, versions, exact command) next to the table.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import shlex
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"


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
    parts = [f"python {platform.python_version()}"]
    for mod in ("numpy", "torch", "triton"):
        try:
            parts.append(f"{mod} {__import__(mod).__version__}")
        except ImportError:
            pass
    return ", ".join(parts)


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
) -> str:
    """Print the table and, when ``record``, append it with its context to BENCHMARKS.md."""
    table = format_table(headers, rows)
    print(f"\n{title}\n{table}")
    if notes:
        print(notes)
    if record:
        command = " ".join(shlex.quote(a) for a in [Path(sys.executable).name, *sys.argv])
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        entry = (
            f"\n## {title}\n\n- date: {stamp}\n- machine: {machine()}\n- versions: {versions()}\n"
            f"- command: `{command}`\n\n{table}\n"
        )
        if notes:
            entry += f"\n{notes}\n"
        if not BENCHMARKS_MD.exists():
            BENCHMARKS_MD.write_text(
                "# Benchmarks\n\nAppended by the scripts under `benchmarks/`; ratios are "
                "measured side by side in one run.\n"
            )
        with BENCHMARKS_MD.open("a") as f:
            f.write(entry)
    return table
