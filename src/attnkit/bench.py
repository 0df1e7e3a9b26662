"""The runner behind ``attnkit bench``: find the repository's benchmark scripts, run each one
with this interpreter, echo its table, and summarise which failed or were skipped.

The benchmarks themselves are scripts under ``benchmarks/`` in attnkit's source repository
(they record each table, with the exact command, in ``benchmarks/results.jsonl`` and
rebuild ``BENCHMARKS.md`` from those records; ``--quick`` and ``--smoke`` record nothing).
They are not part of the installed package, so a ``pip install`` has none to run;
:func:`missing_benchmarks_message` says where they were looked for and what to do.

A script whose optional dependency (torch, triton, transformers, matplotlib) is not
installed is skipped with one line naming the extra that installs it: each script runs
under a small bootstrap (:data:`BOOTSTRAP`) that turns that ImportError into the line and
exit code :data:`SKIPPED`, whether the import sits at the top of the script or deep inside.
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

# The optional modules a benchmark may import, and the attnkit extra that installs each.
EXTRA_OF = {"torch": "torch", "triton": "triton", "transformers": "transformers",
            "matplotlib": "viz"}
SKIPPED = 77  # a script's exit code when it was skipped (automake's "skip")
SKIP_MARK = "attnkit-bench-skip: "  # the bootstrap's line saying why, read by run_script

# Runs ``argv[1]`` as ``__main__`` with ``argv[2:]`` as its arguments. An ImportError of an
# optional module that is not installed (not one raised from inside an installed package)
# becomes one line and exit code SKIPPED instead of a traceback.
BOOTSTRAP = f"""\
import importlib.util, runpy, sys
sys.argv = sys.argv[1:]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except ImportError as err:
    if err.name not in {EXTRA_OF!r} or importlib.util.find_spec(err.name) is not None:
        raise
    extra = {EXTRA_OF!r}[err.name]
    print(f"{SKIP_MARK}needs {{err.name}}, which is not installed: "
          f"pip install 'attnkit[{{extra}}]'", flush=True)
    raise SystemExit({SKIPPED})
"""


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


def run_script(script: Path, flags: Sequence[str], timeout: float,
               env_extra: dict[str, str] | None = None) -> tuple[int, float, str]:
    """Run one script with this interpreter (through :data:`BOOTSTRAP`) from the folder
    above it, echoing its output line by line (indented).

    Returns:
        ``(exit code, seconds, why it was skipped or "")``; a script killed by the timeout
        reports exit code -9, a skipped one :data:`SKIPPED`.
    """
    env = dict(os.environ)
    # The scripts import the same attnkit as this command, installed or not.
    src = str(PACKAGE.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    env["PYTHONUNBUFFERED"] = "1"  # tables appear as they are measured
    env.update(env_extra or {})
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-c", BOOTSTRAP, str(script), *flags], cwd=script.parent.parent,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    why = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith(SKIP_MARK):
                why = line[len(SKIP_MARK):].strip()
            else:
                print(f"  {line.rstrip()}", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    return code, time.perf_counter() - t0, why if code == SKIPPED else ""


def run_benchmarks(scripts: Sequence[Path], *, quick: bool = False, smoke: bool = False,
                   timeout: float = 600.0) -> int:
    """Run ``scripts`` one after another, print a status line per script and a summary
    line last. ``quick`` passes ``--quick`` on (small sizes, nothing recorded); ``smoke``
    passes ``--smoke`` (the smallest sizes, one round: a check that each script runs, whose
    numbers mean nothing).

    Returns:
        0 when every script exited 0 or was skipped for a missing extra, else 1.
    """
    flags = ["--smoke"] if smoke else ["--quick"] if quick else []
    # A smoke run's numbers mean nothing; one thread per library keeps it from crawling on a
    # busy machine (OpenMP threads spin-waiting on shared cores make torch's small ops
    # ~30x slower there: torch_cpu.py --quick took 114 s with two, 4 s with one).
    env_extra = {"OMP_NUM_THREADS": "1"} if smoke else None
    failed, skipped = [], []
    for script in scripts:
        print(f"== {script.name} {' '.join(flags)}", flush=True)
        code, seconds, why = run_script(script, flags, timeout, env_extra)
        if why:
            status = f"skipped, {why}"
            skipped.append(script.name)
        elif code == 0:
            status = f"ok in {seconds:.1f} s"
        elif code == -9:
            status = f"TIMED OUT after {timeout:.0f} s"
        else:
            status = f"FAILED (exit {code}) in {seconds:.1f} s"
        print(f"== {script.name}: {status}", flush=True)
        if code != 0 and not why:
            failed.append(script.name)
    ok = len(scripts) - len(failed) - len(skipped)
    summary = f"bench: {ok}/{len(scripts)} scripts ok"
    if skipped:
        summary += f"; skipped (missing extra): {', '.join(skipped)}"
    if failed:
        summary += f"; failed: {', '.join(failed)}"
    print(summary)
    return 1 if failed else 0
