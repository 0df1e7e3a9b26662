"""The layout rules of DESIGN.md that no single module can check: no import cycles between
modules under src/attnkit, and no file over MAX_LINES lines (a module you can read in one
sitting).

Imports are read with `ast`, not by importing: every `import` and `from ... import`
anywhere in a file counts (inside functions, under `if TYPE_CHECKING:` too), relative ones
resolved against the file's package. `from pkg import name` is an edge to the submodule
`pkg.name` when there is one, else to `pkg` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "attnkit"
MAX_LINES = 450

# Offenders on main when these tests were written, each being fixed on another branch: files
# (path under src/) over MAX_LINES, and import cycles (their modules, sorted, " <-> ").
# The torchsplit and specnp branches fixed them all; test_known_pending_is_still_pending
# fails on any entry that no longer offends, so a new one must be fixed, not listed.
KNOWN_PENDING: set[str] = set()


# -- the import graph -------------------------------------------------------------------------
def module_files(src: Path, package: str) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file of ``package`` under ``src``."""
    modules = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


def imports_of(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The modules of ``modules`` that the file of module ``name`` imports."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from the file's own package
                package = name.split(".") if is_package else name.split(".")[:-1]
                keep = len(package) - (node.level - 1)
                if keep < 1:
                    raise AssertionError(f"{path}: relative import climbs out of the package")
                base = ".".join(package[:keep] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            for alias in node.names:
                child = f"{base}.{alias.name}"
                found.add(child if child in modules else base)
    return {m for m in found if m in modules and m != name}


def import_graph(src: Path, package: str) -> dict[str, set[str]]:
    modules = module_files(src, package)
    return {name: imports_of(name, path, modules) for name, path in modules.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle ``[a, b, ..., a]`` per strongly connected component of more than one module
    (Tarjan's algorithm), each starting at its smallest module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return [_cycle_through(component, graph) for component in sorted(components)]


def _cycle_through(component: list[str], graph: dict[str, set[str]]) -> list[str]:
    """A path from ``component[0]`` back to itself inside the component (breadth-first, so
    the shortest)."""
    start, inside = component[0], set(component)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph[v] & inside):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return [*reversed(path), start]
                if w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"no cycle through {component}")  # a component always has one


def cycle_key(cycle: list[str]) -> str:
    return " <-> ".join(sorted(set(cycle)))


def long_files(src: Path, package: str, limit: int = MAX_LINES) -> dict[str, int]:
    """``{path under src: line count}`` of every file of ``package`` over ``limit`` lines."""
    counts = {}
    for path in sorted((src / package).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            lines = path.read_bytes().count(b"\n")
            if lines > limit:
                counts[path.relative_to(src).as_posix()] = lines
    return counts


# -- the rules --------------------------------------------------------------------------------
def test_no_import_cycles():
    cycles = [c for c in import_cycles(import_graph(SRC, PACKAGE))
              if cycle_key(c) not in KNOWN_PENDING]
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def test_no_file_over_max_lines():
    over = {p: n for p, n in long_files(SRC, PACKAGE).items() if p not in KNOWN_PENDING}
    assert not over, f"files over {MAX_LINES} lines (split them by concept): " + ", ".join(
        f"{p} ({n})" for p, n in over.items()
    )


# The checker's folders, each on a floor: a folder imports only the folders on floors below
# it (`catalogue/` the words, at the bottom; the kinds of check at the top).
CHECK_FLOORS = {
    "catalogue": 0,
    "meet": 1, "render": 1,
    "core": 2,
    "function": 3, "multihead": 3, "block": 3, "model": 3,
}


def test_the_checkers_folders_import_only_folders_below_them():
    """Meeting the user's code (``meet/``) and rendering (``render/``) use the catalogue
    only, the shared core uses those, and every kind of check uses the core: an import
    that runs back up (``meet/`` borrowing a helper of ``core/``) fails here."""
    graph = import_graph(SRC, PACKAGE)
    top = "attnkit.check."
    up = []
    for name, deps in graph.items():
        if not name.startswith(top):
            continue
        here = name[len(top):].split(".")[0]
        for dep in deps:
            there = dep[len(top):].split(".")[0] if dep.startswith(top) else None
            if there and there != here and here in CHECK_FLOORS and \
                    CHECK_FLOORS.get(there, 99) >= CHECK_FLOORS[here]:
                up.append(f"{name} -> {dep}")
    assert not up, f"imports that run up or across the checker's floors: {sorted(up)}"
    folders = {p.name for p in (SRC / "attnkit" / "check").iterdir()
               if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == set(CHECK_FLOORS), f"give every folder a floor: {folders ^ set(CHECK_FLOORS)}"
    users = {name for name, deps in graph.items()
             if any(d.startswith(top + "render") for d in deps)}
    assert "attnkit.check.model.report" in users  # a model's report is shown by render/


def test_known_pending_is_still_pending():
    """An entry fixed elsewhere must leave KNOWN_PENDING, so the list only shrinks."""
    now = set(long_files(SRC, PACKAGE)) | {
        cycle_key(c) for c in import_cycles(import_graph(SRC, PACKAGE))
    }
    assert not KNOWN_PENDING - now, f"fixed, remove from KNOWN_PENDING: {KNOWN_PENDING - now}"


# -- the checks themselves, on a package made for them ----------------------------------------
def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_cycle_check_sees_relative_and_function_level_imports(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from .a import f\n",
        "pkg/a.py": "from .sub import b\n\ndef f():\n    return b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def g():\n    from ..c import h\n    return h\n",
        "pkg/c.py": "import pkg.a\nfrom pkg import sub\n",
        "pkg/d.py": "from . import a\nimport numpy\n",  # into the cycle, not part of it
    })
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg"] == {"pkg.a"}
    assert graph["pkg.a"] == {"pkg.sub.b"}
    assert graph["pkg.sub.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a", "pkg.sub"}
    assert graph["pkg.d"] == {"pkg.a"}
    assert import_cycles(graph) == [["pkg.a", "pkg.sub.b", "pkg.c", "pkg.a"]]


def test_cycle_check_passes_a_layered_package(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from . import top\n",
        "pkg/top.py": "from .low import x\nfrom . import low\n",
        "pkg/low.py": "x = 1\n",
    })
    assert import_cycles(import_graph(tmp_path, "pkg")) == []


@pytest.mark.parametrize("lines, over", [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_line_check_counts_lines(tmp_path, lines, over):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/big.py": "x = 1\n" * lines})
    assert long_files(tmp_path, "pkg") == ({"pkg/big.py": lines} if over else {})
