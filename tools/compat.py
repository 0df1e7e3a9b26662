"""`make test-compat`: attnkit against the oldest supported and the newest released
transformers, each in a venv of its own under .compat/, and a version x result table.

Each venv gets attnkit (editable, extras torch + transformers), the test tools, the
transformers version of its row and torch from TORCH below. Everything else is held to the
versions of requirements.lock, except transformers and the packages only it needs
(tokenizers, huggingface-hub, ...): those resolve freely, so an old transformers gets the
dependencies it was released with. A venv is reused while its stamp (versions and the
constraints it was built from) still matches; building one takes 1-2 minutes (torch is
~1 GB installed).

In each venv it runs tests/integrations and SMOKE (a fast sample of the rest of the suite),
prints the table and exits 1 when any row failed.

    python tools/compat.py                          # the rows of TRANSFORMERS below
    python tools/compat.py --transformers 5.10.4    # one other version (repeatable)
    python tools/compat.py --rebuild                # fresh venvs
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

# -- the tested range -------------------------------------------------------------------------
# The oldest transformers attnkit supports (pyproject.toml's floor) and the newest release
# (`pip index versions transformers`). Raise OLDEST only with a run of this script that
# shows the new floor passing and the old one failing.
TRANSFORMERS = {
    "oldest": "5.4.0",
    "newest": "5.24.0",
}
# torch stays at one version: 2.13.0 is the only CPU build served on this project's machines
# (/opt/wheels). 2.14.1 exists only as a multi-GB CUDA build, so it is not a row here.
TORCH = "2.13.0"

# The integration tests, and a sample of the rest that runs in about half a minute: the torch
# functional API and its nn.MultiheadAttention interop (what a torch release can change), the
# NumPy oracle, and the "install the extra" messages.
INTEGRATION = ["tests/integrations"]
SMOKE = [
    "tests/torch/test_functional.py",
    "tests/torch/test_interop.py",
    "tests/numpy/test_forward_sdpa.py",
    "tests/test_extras.py",
]
# Installed beside attnkit[torch,transformers]; their versions come from the lock.
TEST_TOOLS = ["pytest", "pytest-timeout", "hypothesis"]

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
COMPAT = ROOT / ".compat"
STAMP = "attnkit-compat.json"


# -- constraints: the lock minus transformers and what only it pulls in -----------------------
def parse_lock(text: str) -> dict[str, tuple[str, set[str]]]:
    """``{name: (pin lines, names it is installed via)}`` from the lock; a ``via``
    that is not a package of the lock (attnkit itself, ``-r requirements.in``) is a root."""
    entries: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in text.splitlines():
        pin = re.match(r"^([A-Za-z0-9._-]+)==\S+", line)
        if pin:
            # A universal lock pins some packages once per Python range (``numpy==2.2.6 ;
            # python_full_version < '3.11'``, ...): every line is kept, one per row.
            current = _canonical(pin.group(1))
            pins, via_set = entries.get(current, ("", set()))
            entries[current] = ("\n".join(filter(None, [pins, line.strip()])), via_set)
            continue
        via = re.match(r"^\s+#\s+(?:via\s+)?(\S.*)$", line)
        if current and via and via.group(1) != "via":
            entries[current][1].add(_canonical(via.group(1).split()[0]))
    return entries


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def exclusive_to(package: str, entries: dict[str, tuple[str, set[str]]]) -> set[str]:
    """``package`` and every lock entry that is installed only because of it (every ``via``
    already in the set), grown to a fixed point."""
    out = {package}
    grew = True
    while grew:
        grew = False
        for name, (_, via) in entries.items():
            if name not in out and via and via <= out:
                out.add(name)
                grew = True
    return out


def constraints(lock_text: str) -> str:
    """The constraint file of every venv: the lock's pins except transformers' own deps."""
    entries = parse_lock(lock_text)
    free = exclusive_to("transformers", entries)
    lines = [pin for name, (pin, _) in entries.items() if name not in free]
    header = f"# requirements.lock without {', '.join(sorted(free))} (tools/compat.py)"
    return "\n".join([header, *lines]) + "\n"


# -- venvs ------------------------------------------------------------------------------------
@dataclass
class Row:
    label: str
    transformers: str
    torch: str = "?"
    build: str = ""
    integration: str = ""
    smoke: str = ""
    seconds: float = 0.0
    ok: bool = False


def run(cmd: list[str], log: Path, **kw) -> int:
    """Run ``cmd`` with its output appended to ``log``; the exit code."""
    with open(log, "a") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode


def clean_env() -> dict[str, str]:
    """The environment of a venv's commands: no PYTHONPATH, so it sees its own attnkit."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PIP_CONSTRAINT")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def installed(python: Path) -> dict[str, str]:
    code = ("import importlib.metadata as m, json; "
            "print(json.dumps({p: m.version(p) for p in ('transformers', 'torch')}))")
    proc = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                          env=clean_env())
    return json.loads(proc.stdout) if proc.returncode == 0 else {}


def ensure_venv(row: Row, base_python: str, rebuild: bool, pins: str) -> Path | None:
    """The venv of ``row``, built when missing or stale; None (with ``row.build`` saying
    why) when pip failed."""
    venv = COMPAT / f"transformers-{row.transformers}"
    python = venv / "bin" / "python"
    stamp = {"transformers": row.transformers, "torch": TORCH,
             "constraints": hashlib.sha256(pins.encode()).hexdigest()[:16],
             "pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]}
    log = COMPAT / f"transformers-{row.transformers}.log"
    if not rebuild and python.exists() and (venv / STAMP).exists():
        if json.loads((venv / STAMP).read_text()) == stamp and installed(python):
            row.build = "reused"
            return python
    print(f">> building {venv.relative_to(ROOT)}: transformers {row.transformers}, torch {TORCH}"
          f" (~1 GB, 1-2 min; pip's output goes to {log.relative_to(ROOT)})", flush=True)
    shutil.rmtree(venv, ignore_errors=True)
    log.write_text("")
    t0 = time.perf_counter()
    pin_file = COMPAT / "constraints.txt"
    pin_file.write_text(pins)
    code = run([base_python, "-m", "venv", str(venv)], log)
    if code == 0:
        # As the Makefile does: PIP_CONSTRAINT, which the isolated build of attnkit reads too.
        env = {**clean_env(), "PIP_CONSTRAINT": str(pin_file)}
        code = run([str(python), "-m", "pip", "install", "-q",
                    "-e", f"{ROOT}[torch,transformers]", *TEST_TOOLS,
                    f"transformers=={row.transformers}", f"torch=={TORCH}"],
                   log, env=env, cwd=ROOT)
    if code != 0:
        row.build = f"pip failed (see {log.relative_to(ROOT)})"
        return None
    (venv / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    row.build = f"built in {time.perf_counter() - t0:.0f} s"
    return python


# -- tests ------------------------------------------------------------------------------------
def pytest_counts(python: Path, paths: list[str], name: str) -> tuple[str, bool]:
    """Run pytest on ``paths`` in the venv; ``("N passed, M failed, ...", all passed)``."""
    xml = COMPAT / f"{name}.xml"
    log = COMPAT / f"{name}.log"
    xml.unlink(missing_ok=True)
    log.write_text("")
    code = run([str(python), "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider",
                "--continue-on-collection-errors",
                f"--junitxml={xml}", *paths], log, env=clean_env(), cwd=ROOT)
    if not xml.exists():
        return f"pytest exit {code}, no report", False
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    passed = n["tests"] - n["failures"] - n["errors"] - n["skipped"]
    words = {"failures": "failed", "errors": "error", "skipped": "skipped"}  # as pytest's
    parts = [f"{passed} passed"] + [f"{n[k]} {words[k]}{'s' * (k == 'errors' and n[k] > 1)}"
                                     for k in words if n[k]]
    ok = code == 0 and n["failures"] == 0 and n["errors"] == 0
    if not ok:
        summary = [ln for ln in log.read_text().splitlines()
                   if ln.startswith(("FAILED", "ERROR"))]
        for ln in summary[:8]:
            print(f"   {name}: {ln[:160]}")
        if len(summary) > 8:
            print(f"   {name}: ... {len(summary) - 8} more in {log.relative_to(ROOT)}")
    return ", ".join(parts), ok


def newest_release(python: str) -> str | None:
    """The newest transformers on the package index, None when it cannot be asked."""
    proc = subprocess.run([python, "-m", "pip", "index", "versions", "transformers"],
                          capture_output=True, text=True, env=clean_env())
    found = re.search(r"^transformers \(([^)]+)\)", proc.stdout, re.M)
    return found.group(1) if found else None


def table(rows: list[Row]) -> str:
    head = ["", "transformers", "torch", "venv", "tests/integrations", "smoke", "time", ""]
    body = [[r.label, r.transformers, r.torch, r.build, r.integration, r.smoke,
             f"{r.seconds:.0f} s", "ok" if r.ok else "FAIL"] for r in rows]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *body)]
    fmt = "| " + " | ".join(f"{{:{w}}}" for w in widths) + " |"
    lines = [fmt.format(*head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    return "\n".join(lines + [fmt.format(*b) for b in body])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transformers", action="append", metavar="X.Y.Z",
                        help="test this version instead of the table's (repeatable)")
    parser.add_argument("--rebuild", action="store_true", help="rebuild the venvs")
    parser.add_argument("--python", default=sys.executable,
                        help="the interpreter the venvs are made from (default: this one)")
    args = parser.parse_args(argv)

    versions = ([("given", v) for v in args.transformers] if args.transformers
                else list(TRANSFORMERS.items()))
    COMPAT.mkdir(exist_ok=True)
    latest = newest_release(args.python)
    if latest and latest != TRANSFORMERS["newest"]:
        print(f">> note: the newest transformers on the index is {latest}; TRANSFORMERS in "
              f"tools/compat.py says {TRANSFORMERS['newest']} (try --transformers {latest})")
    pins = constraints(LOCK.read_text())
    rows = [Row(label, version) for label, version in versions]
    for row in rows:
        t0 = time.perf_counter()
        python = ensure_venv(row, args.python, args.rebuild, pins)
        if python is not None:
            row.torch = installed(python).get("torch", "?")
            print(f">> transformers {row.transformers}: tests/integrations, then the smoke set",
                  flush=True)
            tag = f"transformers-{row.transformers}"
            row.integration, ok_int = pytest_counts(python, INTEGRATION, f"{tag}-integration")
            row.smoke, ok_smoke = pytest_counts(python, SMOKE, f"{tag}-smoke")
            row.ok = ok_int and ok_smoke
        row.seconds = time.perf_counter() - t0
    print()
    print(table(rows))
    print(f"smoke: {' '.join(SMOKE)}")
    print(f"torch: {TORCH} in every row, the one CPU build served here "
          f"(2.14.1 is CUDA-only); logs in {COMPAT.relative_to(ROOT)}/")
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
