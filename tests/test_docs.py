"""Every ```python block in README.md and docs/ runs as written.

Each block runs alone, in a fresh interpreter (its own namespace, its own environment
variables, its own process group), in a temporary working folder, so a block can neither
lean on another nor leave files behind. A block that needs an extra that is not installed
is skipped with the extra's name; with every extra (``make test``) none is skipped.
Failures are reported as ``path:line`` of the block's opening fence.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SRC = str(ROOT / "src")
FENCE = re.compile(r"^```python[ \t]*$")

# Modules a block may import -> what must be installed for it to run.
NEEDS = {
    "attnkit.torch": ("torch",),
    "attnkit.distributed": ("torch",),
    "attnkit.triton": ("torch", "triton"),
    "attnkit.viz": ("matplotlib",),
    "torch": ("torch",),
    "triton": ("triton",),
    "matplotlib": ("matplotlib",),
    "attnkit.integrations.transformers": ("torch", "transformers"),
    "transformers": ("transformers",),
}
IMPORT = re.compile(r"^\s*(?:import|from)\s+([\w.]+)", re.MULTILINE)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("**/*.md"))]


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """``(line of the opening fence, code)`` for every ```python block of ``path``."""
    blocks: list[tuple[int, str]] = []
    start, body = None, []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if start is None:
            if FENCE.match(line):
                start, body = number, []
        elif line.strip() == "```":
            blocks.append((start, "\n".join(body) + "\n"))
            start = None
        else:
            body.append(line)
    if start is not None:
        raise AssertionError(f"{path.relative_to(ROOT)}:{start}: ```python block never closed")
    return blocks


CASES = [
    pytest.param(code, id=f"{path.relative_to(ROOT).as_posix()}:{line}")
    for path in doc_files()
    for line, code in python_blocks(path)
]


def missing_packages(code: str) -> list[str]:
    needed: set[str] = set()
    for module in IMPORT.findall(code):
        for prefix, packages in NEEDS.items():
            if module == prefix or module.startswith(prefix + "."):
                needed.update(packages)
    return sorted(p for p in needed if importlib.util.find_spec(p) is None)


def test_blocks_were_found():
    """The collection itself works: every page with an example yields its blocks."""
    pages = {case.id.rsplit(":", 1)[0] for case in CASES}
    expected = {"README.md", "docs/distributed.md", "docs/numpy-gradients.md",
                "docs/torch.md", "docs/triton.md", "docs/viz.md",
                *(f"docs/learn/{p.name}" for p in (ROOT / "docs/learn").glob("0*.md"))}
    assert len(expected) >= 15, sorted(expected)  # the tutorial's 9 chapters are collected
    assert expected <= pages, sorted(expected - pages)
    assert len(CASES) >= 9, [case.id for case in CASES]


@pytest.mark.parametrize("code", CASES)
def test_doc_block_runs(code, tmp_path):
    missing = missing_packages(code)
    if missing:
        pytest.skip(f"needs {', '.join(missing)} (an attnkit extra) installed")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    # A block decides for itself whether Triton runs interpreted; the suite's own setting
    # (tests/conftest.py turns the interpreter on without a GPU) must not decide for it.
    env.pop("TRITON_INTERPRET", None)
    script = tmp_path / "block.py"
    script.write_text(code, encoding="utf-8")
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"the block failed:\n{code}\n--- stderr ---\n{proc.stderr}"
