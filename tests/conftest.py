"""Shared fixtures. Tests seed their own generators; nothing here depends on a GPU."""

from __future__ import annotations

import contextlib
import importlib.util
import os


def _worker_threads() -> int | None:
    """Under pytest-xdist (`make test` runs ``-n auto``), each worker's share of the cores:
    two workers that each start a thread per core for torch and BLAS would run four busy
    threads on a 2-core machine. None when not running as a worker."""
    workers = os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not workers:
        return None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, (cores or 1) // int(workers))


# Set before NumPy and torch load their thread pools, and inherited by the subprocesses that
# tests start (CLI runs, notebook kernels, distributed ranks). A value the caller set wins.
_THREADS = _worker_threads()
if _THREADS is not None:
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_THREADS))

import numpy as np  # noqa: E402
import pytest  # noqa: E402


def _cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


# Without a GPU, Triton kernels run under the interpreter. The switch must be on before
# triton is first imported, and a kernel can be reached from tests/torch (the dispatch) and
# tests/distributed (local blocks) as well as tests/triton, so it is set here, for any
# subset of the suite and any test order.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

if _THREADS is not None and importlib.util.find_spec("torch") is not None:
    import torch

    torch.set_num_threads(_THREADS)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(20261122)


def _check_png(path) -> np.ndarray:
    # Imported here, not at the top: only the figure tests (cli, viz) need matplotlib.
    import matplotlib.image as mpimg

    img = mpimg.imread(path)  # raises when the file is not a readable image
    assert img.ndim == 3 and img.shape[0] > 50 and img.shape[1] > 50, img.shape
    # Not blank: the pixels vary, and more than a sliver of them is not background.
    assert float(img[..., :3].std()) > 0.02
    background = np.all(img[..., :3] > 0.98, axis=-1)
    assert background.mean() < 0.97, f"{background.mean():.3f} of {path} is white"
    return img


@pytest.fixture
def check_png():
    """``check_png(path)``: the file opens as an image whose pixels vary; returns it."""
    return _check_png


# -- tests that measure wall-clock time run alone ---------------------------------------------
def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers", "alone: measures wall-clock time, so under pytest-xdist no other test runs "
        "while it does (the other workers wait)")


@pytest.fixture(autouse=True)
def _alone_when_marked(request, tmp_path_factory):
    """Under pytest-xdist, a test marked ``alone`` runs while no other worker runs a test:
    every test holds a shared lock, an ``alone`` test the exclusive one. A gate lock, held
    by the ``alone`` test while it waits, keeps the other workers from starting new tests
    meanwhile (a shared lock alone would let them starve it). Without xdist: nothing."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        yield
        return
    import fcntl

    alone = request.node.get_closest_marker("alone") is not None
    run_dir = tmp_path_factory.getbasetemp().parent  # shared by the workers of one run
    with contextlib.ExitStack() as stack:
        gate = stack.enter_context(open(run_dir / "attnkit-alone.gate", "a"))
        lock = stack.enter_context(open(run_dir / "attnkit-alone.lock", "a"))
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
