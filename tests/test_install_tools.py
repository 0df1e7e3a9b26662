"""The install machinery: attnkit.torch_build (which torch build `make` and the notebooks'
first cell install, and why; run by tools/torch_build.py) and tools/platforms.py
(`make test-platforms`), on made-up inputs; no network, no install.
The real matrix is resolved by `make test-platforms` itself (a minute or two of downloads).
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"_{name}_tool", ROOT / "tools" / f"{name}.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # scripts, not package modules: loaded from their paths
    return module


torch_build = _load("torch_build")
platforms = _load("platforms")


def test_the_lock_pins_torchs_public_version_which_the_cpu_build_satisfies():
    from packaging.specifiers import SpecifierSet

    version = torch_build.locked_torch(LOCK)
    assert "+" not in version, "a local build (+cpu) in the lock is served by no index but one"
    assert SpecifierSet(f"=={version}").contains(f"{version}+cpu")
    # What the CUDA choice asks for: the public build only, never a local +cpu wheel.
    assert not SpecifierSet(f"==={version}").contains(f"{version}+cpu")
    assert SpecifierSet(f"==={version}").contains(version)


def test_triton_is_locked_for_linux_only():
    lines = [ln for ln in LOCK.read_text().splitlines() if ln.startswith("triton==")]
    assert lines and all("sys_platform == 'linux'" in ln for ln in lines), lines


def test_a_lock_without_an_unconditional_torch_pin_is_refused(tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("torch==2.13.0 ; sys_platform == 'linux'\nnumpy==2.4.6\n")
    with pytest.raises(SystemExit, match="torch=="):
        torch_build.locked_torch(lock)


@pytest.mark.parametrize(("system", "machine", "gpu", "problem", "override", "build", "args"), [
    ("Linux", "x86_64", None, None, "", "cpu",
     ("--extra-index-url", torch_build.CPU_INDEX)),
    ("Linux", "x86_64", None, "URLError: no DNS", "", "cpu-fallback", ()),
    ("Linux", "x86_64", "GPU 0: NVIDIA H100", None, "", "cuda", ("torch===2.13.0",)),
    ("Linux", "x86_64", "GPU 0: NVIDIA H100", None, "cpu", "cpu",
     ("--extra-index-url", torch_build.CPU_INDEX)),
    ("Linux", "x86_64", None, None, "cuda", "cuda", ("torch===2.13.0",)),
    ("Linux", "aarch64", None, None, "pypi", "pypi", ()),
    ("Darwin", "arm64", None, None, "", "macos", ()),
    ("Windows", "AMD64", None, None, "", "pypi", ()),
])
def test_the_build_follows_the_machine(system, machine, gpu, problem, override, build, args):
    choice = torch_build.choose(system, machine, "2.13.0", gpu, problem, override)
    assert (choice.build, choice.pip_args) == (build, args)
    assert choice.reason  # printed by `make`: never a silent choice
    if problem:
        assert problem in choice.reason and "cannot be reached" in choice.reason


def test_the_tool_runs_the_packages_choice_on_a_bare_interpreter():
    """One copy of the choice: the script is attnkit.torch_build's, and it runs before
    anything is installed (`make` calls it on a fresh venv): standard library only, so
    with no site-packages at all (-S) and no PYTHONPATH (-I)."""
    from attnkit import torch_build as package

    assert torch_build.choose is package.choose and torch_build.main is package.main
    env = {k: v for k, v in os.environ.items() if k != "TORCH_CPU_INDEX"}
    proc = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "tools" / "torch_build.py"),
                           "--lock", str(LOCK)], env={**env, "TORCH": "cuda"},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == [f"torch==={torch_build.locked_torch(LOCK)}"]
    assert proc.stderr.startswith(">> torch build: CUDA: TORCH=cuda"), proc.stderr


def test_the_package_asks_for_the_locked_torch_where_there_is_no_lock():
    from attnkit.torch_build import LOCKED_TORCH

    assert LOCKED_TORCH == torch_build.locked_torch(LOCK), (
        "src/attnkit/torch_build.py's LOCKED_TORCH must be the torch that the lock pins")


def test_pip_options_are_one_command_line_and_say_why(tmp_path, monkeypatch, capsys):
    """What the notebooks' first cell puts into `%pip install`: quoted for the shell, with
    the lock's torch asked for by name where there is no lock (outside a clone)."""
    from attnkit import torch_build as package

    wheels = tmp_path / "cpu wheels"
    wheels.mkdir()
    version = package.locked_torch(LOCK)
    monkeypatch.setattr(package.platform, "system", lambda: "Linux")
    monkeypatch.setenv("TORCH", "cpu")
    monkeypatch.setenv("TORCH_CPU_INDEX", str(wheels))
    assert package.pip_options(LOCK) == f"--find-links '{wheels}'"
    said = capsys.readouterr().out
    assert said.startswith(f">> torch build: CPU: TORCH=cpu: torch {version}+cpu"), said

    def no_torch(name: str) -> str:
        raise package.importlib.metadata.PackageNotFoundError(name)

    with monkeypatch.context() as m:
        m.setattr(package.importlib.metadata, "version", no_torch)
        assert package.pip_options() == f"--find-links '{wheels}' torch=={version}"
        m.setenv("TORCH", "cuda")
        assert package.pip_options() == f"torch==={version}"
        m.setenv("TORCH", "pypi")
        assert package.pip_options() == f"torch=={version}"
    capsys.readouterr()
    # A torch installed already (this test's own): nothing asked, so pip keeps it.
    assert package.pip_options() == ""
    assert "is installed already" in capsys.readouterr().out


def test_a_local_folder_as_cpu_index_is_given_to_pip_as_find_links(tmp_path):
    choice = torch_build.choose("Linux", "x86_64", "2.13.0", None, None, index=str(tmp_path))
    assert choice.pip_args == ("--find-links", str(tmp_path))
    assert torch_build.probe(str(tmp_path)) is None
    assert torch_build.probe(str(tmp_path / "missing")) is not None


def test_intel_macs_and_unknown_overrides_are_refused_with_a_way_out():
    with pytest.raises(SystemExit, match="pip install -e ."):
        torch_build.choose("Darwin", "x86_64", "2.13.0", None, None)
    with pytest.raises(SystemExit, match="cpu, cuda, pypi"):
        torch_build.choose("Linux", "x86_64", "2.13.0", None, None, override="rocm")


def test_an_unreachable_index_costs_at_most_the_timeout():
    # Port 9 on the loopback: nothing listens, the connection is refused at once.
    start = time.monotonic()
    problem = torch_build.probe("http://127.0.0.1:9/whl/cpu", timeout=2.0)
    assert problem is not None
    assert time.monotonic() - start < 5.0


def test_a_hanging_name_lookup_costs_the_timeout_not_more(monkeypatch):
    """A socket timeout does not bound getaddrinfo: a resolver that hangs must not hang
    `make demo` (stood in for by an urlopen that blocks for 10 s)."""
    monkeypatch.setattr(urllib.request, "urlopen",
                        lambda *a, **k: time.sleep(10))
    start = time.monotonic()
    problem = torch_build.probe("https://download.example/whl/cpu", timeout=1.0)
    assert problem == "no answer within 1 s"
    assert time.monotonic() - start < 3.0


PYLOCK = textwrap.dedent("""\
    lock-version = "1.0"
    created-by = "uv"

    [[packages]]
    name = "attnkit"
    directory = { path = "." }

    [[packages]]
    name = "fonttools"
    version = "4.68.0"
    wheels = [
        { url = "https://x/fonttools-4.68.0-cp312-cp312-macosx_11_0_arm64.whl", size = 3000000 },
        { url = "https://x/fonttools-4.68.0-py3-none-any.whl", size = 1000000 },
    ]

    [[packages]]
    name = "nvidia-cublas"
    version = "13.1.1.3"
    wheels = [{ url = "https://x/nvidia_cublas-13.1.1.3-py3-none-manylinux.whl", size = 500000000 }]

    [[packages]]
    name = "torch"
    version = "2.13.0+cpu"
    wheels = [{ url = "file:///w/torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl" }]
    """)


def test_pylock_sizes_count_the_platform_wheel_and_mark_stand_ins():
    stub = "torch-2.13.0+cpu-cp312-cp312-manylinux_2_28_x86_64.whl"
    res = platforms.parse_pylock(PYLOCK, {stub: -200_000_000})
    assert res.ok and res.torch == "2.13.0+cpu" and res.packages == 3 and res.cuda
    assert res.mb == pytest.approx(703.0) and res.estimated  # 3 + 500 + 200 MB
    linux, mac = platforms.PLATFORMS[0], platforms.PLATFORMS[2]
    assert platforms.describe(res, linux) == "2.13.0+cpu CUDA"  # nvidia-* in the set
    res.cuda = False
    assert platforms.describe(res, linux) == "2.13.0+cpu CPU"
    assert platforms.describe(res, mac) == "2.13.0+cpu CPU + mps"
    exact = platforms.parse_pylock(PYLOCK, {stub: 200_000_000})
    assert not exact.estimated


def test_stand_in_copies_the_metadata_under_each_missing_python(tmp_path):
    src, out = tmp_path / "wheels", tmp_path / "out"
    src.mkdir()
    out.mkdir()
    info = "torch-2.13.0+cpu.dist-info"
    metadata = "Metadata-Version: 2.4\nName: torch\nVersion: 2.13.0+cpu\nRequires-Dist: sympy\n"
    with zipfile.ZipFile(src / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl", "w") as z:
        z.writestr(f"{info}/METADATA", metadata)
    sizes = platforms.stand_in([src], "2.13.0", out)
    tags = sorted(re.search(r"-(cp3\d+)-", name).group(1) for name in sizes)
    assert tags == sorted(f"cp{v.replace('.', '')}" for v in platforms.PYTHONS)
    real = [n for n, s in sizes.items() if s > 0]
    assert real == ["torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]
    for name, size in sizes.items():
        with zipfile.ZipFile(out / name) as z:
            assert z.read(f"{info}/METADATA").decode() == metadata
        if size < 0:
            tag = re.search(r"-(cp3\d+)-", name).group(1)
            with zipfile.ZipFile(out / name) as z:
                assert f"Tag: {tag}-{tag}-manylinux_2_28_x86_64" in z.read(
                    f"{info}/WHEEL").decode()


def test_the_cpu_builds_size_is_the_one_the_readme_states():
    """The CPU choice's reason states what the README's install table measured for the whole
    ``make demo`` download, and the torch wheel's own size, each said as what it counts."""
    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith("| Linux x86-64, no"))
    total, wheel = (re.search(rf"{what} about (\d+) MB", row).group(1)
                    for what in (r"\|", r"wheel alone:"))
    reason = torch_build.choose("Linux", "x86_64", "2.13.0", None, None).reason
    assert f"torch wheel about {wheel} MB, about {total} MB with" in reason, reason
