"""`make test-platforms`: does what the README's commands install resolve on every platform?

For each platform x Python 3.10-3.13 row, resolves the two install sets of the README
(``make demo``: ``attnkit[torch,viz]``; ``make test``: every extra and the test tools) held
to requirements.lock, as the Makefile installs them, with the torch build
tools/torch_build.py picks for that platform, wheels only, for that platform's tags, without
installing anything. The resolver is ``uv pip compile --python-platform --python-version
--only-binary :all:``, which reads a wheel's metadata with range requests instead of
downloading the wheel (pip's ``install --dry-run --report --platform`` downloads every torch
wheel in full where the index does not serve the metadata on its own). Prints a table:
platform, Python, torch build, resolves yes/no and the download size of each set, and where
the torch build came from; exits 1 when a row does not resolve.

Rows and where their torch comes from:

- ``linux-x86_64 CPU``: PyTorch's CPU wheel index (``--cpu-index``, its real address by
  default). Where it cannot be reached, a local folder stands in (``--stand-in DIR``, or the
  folders of pip's own ``find-links`` configuration that hold a ``torch-*+cpu`` wheel). For
  a Python whose wheel the folder lacks, a metadata-only copy of a wheel it has stands in
  (the same ``Requires-Dist``), and its size is that wheel's (marked ``~``).
- ``linux-x86_64 CUDA``, ``macos-arm64``, ``windows-x86_64``: the package index (``--index``,
  PyPI by default): PyPI's torch is the CUDA build on Linux.

    python tools/platforms.py [--uv PATH] [--python 3.12 ...] [--cpu-index URL]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the TOML reader that pip carries
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))
from torch_build import CPU_INDEX, locked_torch, probe  # noqa: E402

PYTHONS = ("3.10", "3.11", "3.12", "3.13")
SETS = {"demo": ("torch", "viz"), "test": ("torch", "viz", "triton", "transformers", "dev")}
# torch 2.13's macOS wheels are built for macOS 14 (Sonoma) and newer.
MACOS_TARGET = "14.0"


@dataclass(frozen=True)
class Platform:
    """A row group: uv's ``--python-platform``, and which torch build the Makefile picks."""

    name: str
    uv_platform: str
    build: str  # "cpu" (PyTorch's CPU index), "cuda" or "pypi" (the package index)


PLATFORMS = (
    Platform("linux-x86_64", "x86_64-manylinux_2_28", "cpu"),
    Platform("linux-x86_64", "x86_64-manylinux_2_28", "cuda"),
    Platform("macos-arm64", "aarch64-apple-darwin", "pypi"),
    Platform("windows-x86_64", "x86_64-pc-windows-msvc", "pypi"),
)


@dataclass
class Result:
    """What one install set resolved to on one row."""

    ok: bool
    torch: str = ""
    mb: float = 0.0
    estimated: bool = False
    packages: int = 0
    error: str = ""
    cuda: bool = False  # the CUDA libraries (nvidia-*) are in the set


def parse_pylock(text: str, local_sizes: dict[str, int]) -> Result:
    """Read a ``pylock.toml`` written by uv: the torch version, the package count and the
    download size (one wheel per package: the platform's own when there is one).

    Args:
        text: the pylock file.
        local_sizes: sizes of local wheels, by file name, for ``file://`` wheels (whose
            entries carry no size); a stub's name maps to its real wheel's size, negated.

    Returns:
        A resolved :class:`Result`.
    """
    data = tomllib.loads(text)
    total, estimated, torch, count = 0, False, "", 0
    names = {pkg["name"] for pkg in data.get("packages", [])}
    for pkg in data.get("packages", []):
        wheels = pkg.get("wheels", [])
        if not wheels:
            continue  # attnkit itself (a directory)
        count += 1
        if pkg["name"] == "torch":
            torch = pkg["version"]
        specific = [w for w in wheels if not w["url"].endswith("-none-any.whl")]
        wheel = (specific or wheels)[0]
        size = wheel.get("size")
        if size is None:
            size = local_sizes.get(wheel["url"].rsplit("/", 1)[-1], 0)
            estimated |= size < 0
        total += abs(size)
    cuda = any(name.startswith("nvidia-") for name in names)
    return Result(True, torch, total / 1e6, estimated, count, cuda=cuda)


def describe(res: Result, plat: Platform) -> str:
    """The torch column: version and build, from what the resolver chose."""
    if not res.torch:
        return "-"
    if res.cuda:
        return f"{res.torch} CUDA"
    return f"{res.torch} CPU" + (" + mps" if plat.name.startswith("macos") else "")


def configured_find_links() -> list[Path]:
    """Folders of pip's own configuration (environment and config files) that hold a local
    ``torch-*+cpu`` wheel: what ``make demo`` gets on a machine that serves one."""
    spots = os.environ.get("PIP_FIND_LINKS", "").split()
    try:
        out = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                             capture_output=True, text=True, timeout=60).stdout
        for m in re.finditer(r"find-links='([^']*)'", out):
            spots += m.group(1).split()
    except (OSError, subprocess.TimeoutExpired):
        pass
    found = []
    for spot in dict.fromkeys(spots):
        folder = Path(spot.removeprefix("file://"))
        if folder.is_dir() and any(folder.glob("torch-*+cpu-*.whl")):
            found.append(folder)
    return found


def stand_in(folders: list[Path], version: str, out: Path) -> dict[str, int]:
    """Fill ``out`` with the local CPU wheels of ``folders`` and, for each Python that has
    none, a metadata-only copy of one of them (same ``Requires-Dist``, that Python's tags).

    Returns:
        ``{file name: size}``; a copy's size is its source wheel's, negated (an estimate).
    """
    sizes: dict[str, int] = {}
    real = sorted(w for f in folders for w in f.glob(f"torch-{version}+cpu-*.whl"))
    for wheel in real:
        (out / wheel.name).symlink_to(wheel)
        sizes[wheel.name] = wheel.stat().st_size
    linux = [w for w in real if "manylinux" in w.name and "x86_64" in w.name]
    if not linux:
        return sizes
    source = linux[0]
    with zipfile.ZipFile(source) as z:
        info = f"torch-{version}+cpu.dist-info"
        metadata = z.read(f"{info}/METADATA")
    for py in PYTHONS:
        tag = "cp" + py.replace(".", "")
        if any(f"-{tag}-{tag}-" in w.name for w in real):
            continue
        name = f"torch-{version}+cpu-{tag}-{tag}-manylinux_2_28_x86_64.whl"
        wheel_file = (f"Wheel-Version: 1.0\nGenerator: tools/platforms.py\nRoot-Is-Purelib: "
                      f"false\nTag: {tag}-{tag}-manylinux_2_28_x86_64\n").encode()
        with zipfile.ZipFile(out / name, "w") as z:
            z.writestr(f"{info}/METADATA", metadata)
            z.writestr(f"{info}/WHEEL", wheel_file)
            z.writestr(f"{info}/RECORD", f"{info}/METADATA,,\n{info}/WHEEL,,\n{info}/RECORD,,\n")
        sizes[name] = -source.stat().st_size
    return sizes


def resolve(uv: str, plat: Platform, py: str, extras: tuple[str, ...], source: list[str],
            local_sizes: dict[str, int], work: Path) -> Result:
    """Resolve one install set on one row with ``uv pip compile``; no install."""
    out = work / f"pylock.{plat.name}-{plat.build}-{py.replace('.', '')}-{len(extras)}.toml"
    cmd = [uv, "pip", "compile", "pyproject.toml", *(a for e in extras for a in ("--extra", e)),
           "--constraint", "requirements.lock", "--python-platform", plat.uv_platform,
           "--python-version", py, "--only-binary", ":all:", "--format", "pylock.toml",
           "--quiet", "--no-header", "--output-file", str(out), *source]
    env = {**os.environ, "MACOSX_DEPLOYMENT_TARGET": MACOS_TARGET}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0:
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return Result(False, error=" | ".join(lines[-3:]))
    return parse_pylock(out.read_text(), local_sizes)


def sources(plat: Platform, args: argparse.Namespace, cpu: list[str]) -> tuple[list[str], str]:
    """uv's index options for a row, and the note on where its torch came from."""
    index = ["--index-url", args.index] if args.index else []
    if plat.build == "cpu":
        return [*index, *cpu[1:]], cpu[0]
    return index, f"the index ({args.index})" if args.index else "PyPI (real)"


def cpu_source(args: argparse.Namespace, version: str, work: Path) -> tuple[list[str], dict]:
    """How the CPU rows reach a CPU build: ``[note, uv options...]`` and local wheel sizes."""
    problem = probe(args.cpu_index)
    if problem is None:
        flag = "--find-links" if "://" not in args.cpu_index else "--extra-index-url"
        return [f"CPU index {args.cpu_index} (real)", flag, args.cpu_index,
                "--index-strategy", "unsafe-best-match"], {}
    folders = [Path(d) for d in args.stand_in] or configured_find_links()
    folder = work / "cpu-stand-in"
    folder.mkdir()
    sizes = stand_in(folders, version, folder)
    if not sizes:
        return ["PyPI (the CPU index is unreachable and no local +cpu wheel stands in)"], {}
    real = [n for n, s in sizes.items() if s > 0]
    print(f">> PyTorch's CPU index {args.cpu_index}: {problem}. Standing in: "
          f"{', '.join(real)} from {', '.join(map(str, folders))}"
          + ("; for the other Pythons, metadata-only copies of it under their tags "
             "(sizes marked ~ are that wheel's)" if len(real) < len(sizes) else ""))
    return ["local stand-in for the CPU index", "--find-links", str(folder)], sizes


def table(rows: list[tuple[Platform, str, dict[str, Result], str]]) -> str:
    """The matrix as a Markdown table."""
    head = ("| platform | Python | torch build | `make demo` resolves | download | "
            "`make test` resolves | download | torch from |")
    lines = [head, "|" + " --- |" * 8]
    for plat, py, res, where in rows:
        demo, test = res["demo"], res["test"]
        torch = describe(test if test.ok else demo, plat)

        def cell(r: Result) -> tuple[str, str]:
            mb = f"{'~' if r.estimated else ''}{r.mb:,.0f} MB" if r.ok else "-"
            return ("yes" if r.ok else f"**no**: {r.error[:200]}"), mb

        lines.append(f"| {plat.name} ({plat.build}) | {py} | {torch} | "
                     f"{' | '.join(cell(demo))} | {' | '.join(cell(test))} | {where} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--uv", default="uv", help="the uv executable")
    ap.add_argument("--python", action="append", choices=PYTHONS, help="only these Pythons")
    ap.add_argument("--index", default="", help="the package index (default: uv's, PyPI)")
    ap.add_argument("--cpu-index", default=os.environ.get("TORCH_CPU_INDEX") or CPU_INDEX,
                    help="PyTorch's CPU wheel index (a URL, or a folder of wheels)")
    ap.add_argument("--stand-in", action="append", default=[],
                    help="a folder of CPU wheels used when --cpu-index cannot be reached")
    ap.add_argument("--jobs", type=int, default=4)
    args = ap.parse_args(argv)
    version = locked_torch(ROOT / "requirements.lock")
    with tempfile.TemporaryDirectory(prefix="attnkit-platforms-") as tmp:
        work = Path(tmp)
        cpu, sizes = cpu_source(args, version, work)
        jobs = []
        for plat in PLATFORMS:
            source, where = sources(plat, args, cpu)
            for py in args.python or PYTHONS:
                jobs.append((plat, py, source, where))
        with ThreadPoolExecutor(args.jobs) as pool:
            futures = [{name: pool.submit(resolve, args.uv, plat, py, extras, source, sizes, work)
                        for name, extras in SETS.items()} for plat, py, source, _ in jobs]
            rows = [(plat, py, {k: f.result() for k, f in fut.items()}, where)
                    for (plat, py, _, where), fut in zip(jobs, futures)]
    print(table(rows))
    bad = sum(not r.ok for *_, res, _ in rows for r in res.values())
    print(f"\n{len(rows)} rows x {len(SETS)} install sets: "
          + (f"{bad} did not resolve" if bad else "all resolve")
          + f" (torch {version}, held to requirements.lock, wheels only).")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
