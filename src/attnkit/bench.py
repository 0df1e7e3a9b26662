"""The runner behind ``attnkit bench``: find the repository's benchmark scripts, run each one
with this interpreter, echo its table, and summarise which failed.

The benchmarks themselves are scripts under ``benchmarks/`` in attnkit's source repository
(they append their results, with the exact command, to ``BENCHMARKS.md`` beside
them). They are not part of the installed package, so a ``pip install`` has none to run;
:func:`missing_benchmarks_message` says where they were looked for and what to do.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "benchmark_folders",
    "find_benchmarks",
    "missing_benchmarks_message",
    "run_benchmarks",
    "run_script",
    "select_scripts",
]

PACKAGE = Path(__file__).resolve().parent  # <repo>/src/attnkit in a source checkout


def benchmark_folders() -> tuple[Path, Path]:
    """Where ``attnkit bench`` looks, in order: ``<repo>/benchmarks`` of a source checkout
    (``<repo>/src/attnkit`` -> ``<repo>/benchmarks``), then ``./benchmarks``."""
    return PACKAGE.parent.parent / "benchmarks", Path.cwd() / "benchmarks"


def find_benchmarks() -> Path | None:
    """The first of :func:`benchmark_folders` that exists; None when neither does."""
    return next((folder for folder in benchmark_folders() if folder.is_dir()), None)


def missing_benchmarks_message() -> str:
    """One line for a ``pip install``: the scripts live in the repository, not the package."""
    looked = " and ".join(dict.fromkeys(str(p) for p in benchmark_folders()))
    return (
        f"no benchmarks/ folder (looked in {looked}): the benchmarks are scripts in "
        f"attnkit's source repository, not in the installed package; run `attnkit bench` "
        f"inside a clone of the repository, or pass its folder: "
        f"attnkit bench --dir PATH/TO/attnkit/benchmarks"
    )


def select_scripts(folder: Path, only: Sequence[str] | None = None) -> list[Path]:
    """The scripts of ``folder`` in name order (helpers named ``_*.py`` are not run), kept
    to those whose file name contains one of ``only`` when given."""
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if only:
        scripts = [p for p in scripts if any(name in p.name for name in only)]
    return scripts


def run_script(script: Path, flags: Sequence[str], timeout: float) -> tuple[int, float]:
    """Run one script with this interpreter from the folder above it, echoing its output
    line by line (indented).

    Returns:
        ``(exit code, seconds)``; a script killed by the timeout reports exit code -9.
    """
    env = dict(os.environ)
    # The scripts import the same attnkit as this command, installed or not.
    src = str(PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script), *flags], cwd=script.parent.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"  {line.rstrip()}", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    return code, time.perf_counter() - t0


def run_benchmarks(scripts: Sequence[Path], *, quick: bool = False,
                   timeout: float = 600.0) -> int:
    """Run ``scripts`` one after another (``--quick`` passed on when ``quick``), print a
    status line per script and a summary line last.

    Returns:
        0 when every script exited 0, else 1.
    """
    flags = ["--quick"] if quick else []
    failed = []
    for script in scripts:
        print(f"== {script.name} {' '.join(flags)}", flush=True)
        code, seconds = run_script(script, flags, timeout)
        status = "ok" if code == 0 else (
            f"TIMED OUT after {timeout:.0f} s" if code == -9 else f"FAILED (exit {code})"
        )
        print(f"== {script.name}: {status} in {seconds:.1f} s", flush=True)
        if code != 0:
            failed.append(script.name)
    summary = f"bench: {len(scripts) - len(failed)}/{len(scripts)} scripts ok"
    if failed:
        summary += f"; failed: {', '.join(failed)}"
    print(summary)
    return 1 if failed else 0
