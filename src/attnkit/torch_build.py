"""Which torch build to install on this machine, and the pip options that get it.

One choice, made here for both ways in: ``make demo`` / ``make test`` (through
``tools/torch_build.py``, which runs this module from the clone's ``src/`` before anything
is installed: it needs the standard library only) and the first cell of the tutorial's
notebooks (:func:`pip_options`), in a clone or from an installed attnkit.

The lock pins torch's public version (``torch==2.13.0``). By PEP 440 a local build such as
``2.13.0+cpu`` satisfies that pin, and pip prefers it when one is on offer, so the lock
stays the same on every platform and this module only chooses where the build comes from:

- Linux without an NVIDIA driver: the CPU build from PyTorch's CPU wheel index (its wheel
  alone about 190 MB, about 245 MB with the rest of what ``make demo`` installs, instead of
  about 3 GB with the CUDA libraries), given to pip as an extra index. The index
  is probed first with a short timeout; when it cannot be reached pip takes what the
  machine's own pip configuration offers (a local ``+cpu`` wheel where a wheel folder is
  configured, otherwise PyPI's default build, which carries the CUDA libraries).
- Linux with an NVIDIA driver: PyPI's CUDA build (and triton, which it pins), so that
  ``attnkit.triton`` runs compiled. The requirement ``torch===VERSION`` keeps a local
  ``+cpu`` wheel that a machine's configuration may offer from being chosen instead.
- macOS (Apple silicon) and Windows: PyPI's build (CPU, and Apple's GPU through ``mps``).

``TORCH=cpu|cuda|pypi`` in the environment (``make demo TORCH=cuda``, or ``%env TORCH=cpu``
in a notebook) overrides the detection; ``TORCH_CPU_INDEX`` names another CPU index (a
mirror, or a local folder served as one).

Usage: ``python -m attnkit.torch_build [--lock requirements.lock]`` prints the pip
arguments, one per line (the choice and why on stderr); ``--installed`` says which build is
installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import threading
import urllib.request
from dataclasses import dataclass
from pathlib import Path

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PROBE_TIMEOUT_S = 5.0
# The torch that requirements.lock pins (a test keeps the two equal): what an install
# without the lock asks for, so that it gets the build and version `make demo` would, even
# from a package index that has a newer CUDA build than the CPU index has a +cpu one.
LOCKED_TORCH = "2.13.0"
CHOICES = ("cpu", "cuda", "pypi")


@dataclass(frozen=True)
class Choice:
    """The build to install: ``build`` names it, ``pip_args`` get it, ``reason`` says why."""

    build: str
    pip_args: tuple[str, ...]
    reason: str


def locked_torch(lock: Path) -> str:
    """The torch version the lock pins for every platform (``torch==X`` with no marker).

    Args:
        lock: the requirements lock.

    Returns:
        The version string, e.g. ``"2.13.0"``.
    """
    for line in Path(lock).read_text().splitlines():
        m = re.match(r"torch==([0-9][^\s;#]*)\s*(#.*)?$", line.strip())
        if m:
            return m.group(1)
    raise SystemExit(f"{lock}: no unconditional 'torch==VERSION' line")


def nvidia_gpu() -> str | None:
    """The first NVIDIA GPU that the driver lists, or None without a driver."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15)
    except (OSError, subprocess.TimeoutExpired):
        return None
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    return gpus[0] if out.returncode == 0 and gpus else None


def probe(index: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when ``index`` answers for torch within ``timeout`` seconds, else why not.

    Args:
        index: a PEP 503 index URL (``https://...``) or a local folder used as one.
        timeout: seconds for the whole request.

    Returns:
        None if reachable; otherwise a short description of the failure.
    """
    if "://" not in index:
        return None if Path(index).is_dir() else f"{index} is not a folder"
    url = index.rstrip("/") + "/torch/"
    answer = [f"no answer within {timeout:g} s"]

    def ask() -> None:
        try:
            req = urllib.request.Request(url, method="HEAD")
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (https)
                answer[0] = None if resp.status < 400 else f"HTTP {resp.status}"
        except Exception as exc:  # DNS failure, refused, timeout, TLS: all mean "not here"
            answer[0] = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"

    # The socket timeout does not bound a name lookup that hangs; the thread's join does.
    worker = threading.Thread(target=ask, daemon=True)
    worker.start()
    worker.join(timeout)
    return answer[0]


def choose(
    system: str,
    machine: str,
    version: str,
    gpu: str | None,
    index_problem: str | None,
    override: str = "",
    index: str = CPU_INDEX,
) -> Choice:
    """Decide the torch build from what was detected; no I/O.

    Args:
        system: ``platform.system()`` (``Linux``, ``Darwin``, ``Windows``).
        machine: ``platform.machine()`` (``x86_64``, ``arm64``, ...).
        version: the locked torch version.
        gpu: the NVIDIA GPU the driver lists, or None.
        index_problem: None when the CPU index answered, else why it did not.
        override: ``cpu``, ``cuda``, ``pypi`` or empty (detect).
        index: the CPU index to use.

    Returns:
        The chosen build, its pip arguments and the reason, for the log.
    """
    if override and override not in CHOICES:
        raise SystemExit(f"TORCH={override!r}: use one of {', '.join(CHOICES)}")
    size_cuda = "about 3 GB with the CUDA libraries and triton"
    if system == "Darwin":
        if machine != "arm64" and override != "pypi":
            raise SystemExit(
                f"torch {version} ships no wheel for Intel Macs (x86_64). The NumPy part of "
                "attnkit works there: pip install -e .  (the torch extras need Apple silicon)"
            )
        return Choice("macos", (), f"macOS {machine}: PyPI's torch {version} (CPU, and Apple's "
                      "GPU as device 'mps'); no triton, which ships no macOS wheels")
    if system == "Windows" or override == "pypi":
        return Choice("pypi", (), f"{system} {machine}: PyPI's default torch {version} build")
    if override == "cuda" or (gpu and override != "cpu"):
        why = f"NVIDIA driver found ({gpu})" if gpu else "TORCH=cuda"
        return Choice("cuda", (f"torch==={version}",),
                      f"CUDA: {why}: PyPI's torch {version} CUDA build ({size_cuda}), "
                      "so attnkit.triton and benchmarks/triton_gpu.py run on the GPU")
    why = "TORCH=cpu" if override == "cpu" else f"Linux {machine}, no NVIDIA driver found"
    if index_problem is None:
        flag = "--extra-index-url" if "://" in index else "--find-links"
        return Choice("cpu", (flag, index),
                      f"CPU: {why}: torch {version}+cpu from PyTorch's CPU index {index} "
                      "(no CUDA libraries: the torch wheel about 190 MB, about 245 MB "
                      "with attnkit's other dependencies)")
    return Choice("cpu-fallback", (),
                  f"CPU: {why}, but PyTorch's CPU index {index} cannot be reached "
                  f"({index_problem}): pip takes torch {version} from the sources its own "
                  "configuration lists: a local +cpu wheel where one is offered, otherwise "
                  f"PyPI's default build ({size_cuda})")


def detect(version: str) -> Choice:
    """The build for this machine: :func:`choose` on what is detected here (the platform,
    ``nvidia-smi``, the CPU index probed within ``PROBE_TIMEOUT_S``) and the ``TORCH`` and
    ``TORCH_CPU_INDEX`` environment variables.

    Args:
        version: the locked torch version.

    Returns:
        The chosen build.
    """
    override = os.environ.get("TORCH", "").strip().lower()
    index = os.environ.get("TORCH_CPU_INDEX", "").strip() or CPU_INDEX
    system, machine = platform.system(), platform.machine()
    gpu = nvidia_gpu() if system == "Linux" and override in ("", "cuda") else None
    needs_probe = system == "Linux" and override in ("", "cpu") and not gpu
    problem = probe(index) if needs_probe else None
    return choose(system, machine, version, gpu, problem, override, index)


def pip_options(lock: str | os.PathLike[str] | None = None) -> str:
    """The pip options that install this machine's torch build, as one command line for
    ``%pip install``; prints which build and why.

    Without a lock, torch is asked for at :data:`LOCKED_TORCH` (``torch==2.13.0``, which
    the ``+cpu`` build satisfies too), unless a torch is installed already: then nothing,
    and pip keeps that torch where it meets attnkit's requirements.

    Args:
        lock: a requirements lock that pins torch (a clone's ``requirements.lock``, which
            the caller passes to pip too), or None for an install from the package index.

    Returns:
        E.g. ``"--extra-index-url https://download.pytorch.org/whl/cpu"``, or ``""`` where
        PyPI's build is the one.
    """
    if lock is not None:
        choice = detect(locked_torch(Path(lock)))
        args = choice.pip_args
    else:
        try:
            have = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            have = None
        if have is not None:
            print(f">> torch build: torch {have} is installed already: pip keeps it where it "
                  "meets attnkit's requirements")
            return ""
        choice = detect(LOCKED_TORCH)
        pinned = any(arg.startswith("torch=") for arg in choice.pip_args)
        args = choice.pip_args if pinned else (*choice.pip_args, f"torch=={LOCKED_TORCH}")
    print(f">> torch build: {choice.reason}")
    join = subprocess.list2cmdline if platform.system() == "Windows" else shlex.join
    return join(args)


def installed() -> str:
    """One line on the torch that is installed: version, and what it computes on."""
    import torch

    where = []
    if torch.version.cuda:
        where.append(f"CUDA {torch.version.cuda} build, "
                     + ("a GPU is visible" if torch.cuda.is_available() else "no GPU visible"))
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        where.append("Apple GPU (mps) available")
    return f">> installed torch {torch.__version__} ({'; '.join(where) or 'CPU build'})"


def main(argv: list[str] | None = None) -> int:
    """The command line (see the module's docstring); returns the exit status."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--lock", type=Path, default=Path("requirements.lock"))
    ap.add_argument("--installed", action="store_true",
                    help="say which torch build is installed, and exit")
    args = ap.parse_args(argv)
    if args.installed:
        print(installed())
        return 0
    choice = detect(locked_torch(args.lock))
    print(f">> torch build: {choice.reason}", file=sys.stderr)
    print("\n".join(choice.pip_args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
