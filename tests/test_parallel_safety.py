"""`make test` runs the suite in pytest-xdist workers (``-n auto``): each worker must keep
to its share of the cores, or two workers on a 2-core machine each start a thread per core
for torch and for BLAS (tests/conftest.py sets the limits before either loads)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_make_test_runs_pytest_on_every_core_and_lists_the_slowest():
    makefile = (ROOT / "Makefile").read_text()
    args = re.search(r"^PYTEST_ARGS \?= (.*)$", makefile, re.M)
    assert args and "-n auto" in args.group(1) and "--durations=" in args.group(1)
    assert re.search(r"^\t\$\(PY\) -m pytest -q \$\(PYTEST_ARGS\)$", makefile, re.M)


def test_an_xdist_worker_keeps_to_its_share_of_the_cores():
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        pytest.skip("not in a pytest-xdist worker (`make test` runs -n auto)")
    torch = pytest.importorskip("torch")
    share = max(1, len(os.sched_getaffinity(0)) // int(workers))
    assert torch.get_num_threads() == share
    # Inherited by what tests start: a child process sees the same limit.
    out = subprocess.run([sys.executable, "-c", "import os; print(os.environ['OMP_NUM_THREADS'])"],
                         capture_output=True, text=True, check=True).stdout.strip()
    assert out == os.environ["OMP_NUM_THREADS"]
