"""`make test` runs the suite in pytest-xdist workers (``-n auto``): each worker must keep
to its share of the cores, or two workers on a 2-core machine each start a thread per core
for torch and for BLAS (tests/conftest.py sets the limits before either loads)."""

from __future__ import annotations

import json
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


ALONE_SUITE = '''
import json, os, time

import pytest

LOG = os.environ["ALONE_LOG"]


def _record(name):
    start = time.time()
    time.sleep(0.4)
    with open(LOG, "a") as f:
        f.write(json.dumps([name, start, time.time()]) + "\\n")


@pytest.mark.parametrize("i", range(8))
def test_busy(i):
    _record(f"busy{i}")


@pytest.mark.alone
def test_timed():
    _record("alone")
'''


def test_an_alone_test_shares_the_cores_with_no_other_test(tmp_path):
    """The conftest's lock, in a small suite run on two workers: while the ``alone`` test
    runs, no other test does."""
    pytest.importorskip("xdist")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((ROOT / "tests" / "conftest.py").read_text())
    (suite / "test_suite.py").write_text(ALONE_SUITE)
    log = tmp_path / "log.jsonl"
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "PYTEST_CURRENT"))}
    env["ALONE_LOG"] = str(log)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p",
                           "no:cacheprovider", "--rootdir", str(suite), str(suite)],
                          cwd=suite, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(runs) == 9
    (_, a0, a1), = [r for r in runs if r[0] == "alone"]
    overlapping = [name for name, s0, s1 in runs if name != "alone" and s0 < a1 and a0 < s1]
    assert not overlapping, runs
