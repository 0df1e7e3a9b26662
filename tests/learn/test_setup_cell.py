"""The notebooks' first cell installs the torch build that `make demo` would on the same
machine: the CPU build from PyTorch's CPU index on Linux without an NVIDIA driver (not
PyPI's CUDA build, about 2.5 GB more), PyPI's build with a driver, on macOS and on Windows;
in a clone (at the lock's versions) and from the package index (attnkit first, then the
torch that the lock pins, unless a torch is installed); nothing where attnkit is importable.

The cell runs in a real IPython shell (so ``%pip`` lines are expanded as a kernel expands
them) in a fresh interpreter where attnkit cannot be imported; ``%pip`` only records its
line, and an "install" of attnkit puts this clone's ``src`` on the path. The platform,
``nvidia-smi`` and the CPU index's answer are stood in for.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
CPU_INDEX = "--extra-index-url https://download.pytorch.org/whl/cpu"
TORCH = "torch===2.13.0"  # what the lock pins (tests/test_install_tools.py checks the lock)

for _tool in ("jupytext", "nbformat", "IPython"):
    if importlib.util.find_spec(_tool) is None:
        pytest.skip(f"the setup cell's tests need {_tool} (the dev extra)",
                    allow_module_level=True)

_spec = importlib.util.spec_from_file_location("attnkit_tools_notebooks_setup",
                                               ROOT / "tools" / "notebooks.py")
notebooks = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(notebooks)

# Runs the cell (argv: cell file, case as JSON) and prints one line: RESULT {json}.
DRIVER = r"""
import importlib.metadata, json, platform, sys, urllib.error, urllib.request
from pathlib import Path

cell, case = Path(sys.argv[1]).read_text(encoding="utf-8"), json.loads(sys.argv[2])
if not case["importable"]:  # no attnkit: drop the path entries that hold one
    sys.path[:] = [p for p in sys.path if not (Path(p or ".") / "attnkit").is_dir()]
if not case["torch_installed"]:
    installed = importlib.metadata.version

    def version(name):
        if name == "torch":
            raise importlib.metadata.PackageNotFoundError(name)
        return installed(name)

    importlib.metadata.version = version
if case["system"]:
    platform.system = lambda: case["system"]
    platform.machine = lambda: case["machine"]

class Answer:
    status = 200
    def __enter__(self): return self
    def __exit__(self, *exc): return False

def urlopen(request, timeout):
    if not case["index_up"]:
        raise urllib.error.URLError("Name or service not known")
    assert request.full_url == "https://download.pytorch.org/whl/cpu/torch/", request.full_url
    return Answer()

urllib.request.urlopen = urlopen
from IPython.core.interactiveshell import InteractiveShell

shell = InteractiveShell.instance()
lines = []

def pip(line):
    lines.append(line)
    if line.endswith(" attnkit") and case["src"] not in sys.path:
        sys.path.append(case["src"])  # stands for attnkit installed from the index

shell.register_magic_function(pip, "line", "pip")
ok = shell.run_cell(cell).success
print("RESULT " + json.dumps({"ok": ok, "pip": lines}))
"""


def setup_cell() -> str:
    """The first cell of chapter 1's notebook, as tools/notebooks.py makes it now."""
    chapter = notebooks.chapters(notebooks.LEARN)[0]
    return notebooks.make_notebook(chapter).cells[0].source


def run_cell(tmp_path: Path, *, cwd: Path, gpu: bool = False, system: str = "",
             machine: str = "", index_up: bool = True, importable: bool = False,
             torch_installed: bool = False):
    """The cell's ``%pip`` lines and its printout, run as the arguments say."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if gpu:  # a driver that lists one GPU
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)'\n")
        smi.chmod(0o755)
    cell = tmp_path / "cell.py"
    cell.write_text(setup_cell(), encoding="utf-8")
    env = {k: v for k, v in os.environ.items()
           if k not in ("TORCH", "TORCH_CPU_INDEX", "PYTHONPATH")}
    env.update(PATH=str(bin_dir), IPYTHONDIR=str(tmp_path / "ipython"))
    if importable:
        env["PYTHONPATH"] = str(SRC)
    case = {"system": system, "machine": machine, "index_up": index_up,
            "importable": importable, "torch_installed": torch_installed, "src": str(SRC)}
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(cell), json.dumps(case)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
    result = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and result, proc.stdout + proc.stderr
    found = json.loads(result[-1][len("RESULT "):])
    assert found["ok"], proc.stdout + proc.stderr
    return found["pip"], proc.stdout


def clone_install(options: str) -> str:
    return f'install -q -c "{ROOT}/requirements.lock" {options} -e "{ROOT}[torch,viz]"'


@pytest.mark.parametrize(("gpu", "system", "machine", "index_up", "options"), [
    (False, "", "", True, CPU_INDEX),  # this Linux machine, no driver: the CPU build
    (True, "", "", True, TORCH),  # a driver: PyPI's CUDA build, never a local +cpu wheel
    (False, "", "", False, ""),  # the CPU index cannot be reached: pip's own sources
    (False, "Darwin", "arm64", True, ""),
    (False, "Windows", "AMD64", True, ""),
], ids=["linux-cpu", "linux-nvidia", "linux-cpu-index-down", "macos", "windows"])
def test_in_a_clone_the_cell_installs_what_make_demo_would(tmp_path, gpu, system, machine,
                                                           index_up, options):
    if sys.platform != "linux":
        pytest.skip("stands in for nvidia-smi with a shell script")
    lines, out = run_cell(tmp_path, cwd=ROOT / "docs" / "learn", gpu=gpu, system=system,
                          machine=machine, index_up=index_up)
    assert lines == [clone_install(options)]
    assert ">> torch build: " in out and "\nattnkit 0.1.0" in out, out


@pytest.mark.parametrize(("gpu", "torch_installed", "options", "said"), [
    (False, False, f"{CPU_INDEX} torch==2.13.0", "no NVIDIA driver found"),
    (True, False, TORCH, "NVIDIA driver found (GPU 0: NVIDIA H100"),
    (False, True, "", "is installed already"),  # kept: no torch asked for, no download
], ids=["linux-cpu", "linux-nvidia", "torch-installed"])
def test_outside_a_clone_attnkit_comes_first_and_chooses(tmp_path, gpu, torch_installed,
                                                         options, said):
    """No lock there: the lock's torch is asked for by name, so that a package index whose
    newest CUDA build is newer than the CPU index's +cpu one cannot win."""
    if sys.platform != "linux":
        pytest.skip("stands in for nvidia-smi with a shell script")
    away = tmp_path / "notebooks"
    away.mkdir()
    lines, out = run_cell(tmp_path, cwd=away, gpu=gpu, torch_installed=torch_installed)
    assert lines == ["install -q attnkit", f'install -q {options} "attnkit[torch,viz]"']
    assert said in out and "\nattnkit 0.1.0" in out, out


def test_where_attnkit_is_importable_the_cell_installs_nothing(tmp_path):
    lines, out = run_cell(tmp_path, cwd=ROOT / "docs" / "learn", importable=True)
    assert lines == [] and out.startswith("attnkit 0.1.0\n"), out
