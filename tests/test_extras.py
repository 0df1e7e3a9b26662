"""Without an extra installed, attnkit says which one to install.

The missing package is simulated in a fresh interpreter by ``sys.modules[name] = None``,
which makes ``import name`` fail with the ``ModuleNotFoundError`` an absent package gives.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_without(module: str, code: str) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter where ``module`` cannot be imported."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (SRC, env.get("PYTHONPATH")) if p)
    script = f"import sys\nsys.modules[{module!r}] = None\n" + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.mark.parametrize(
    "missing, code, extra",
    [
        ("torch", "import attnkit.torch", "torch"),
        ("torch", "import attnkit.distributed", "torch"),
        ("torch", "import attnkit.gpt", "torch"),
        ("torch", "from attnkit.torch import MultiHeadAttention", "torch"),
        # attnkit.triton imports without Triton (is_available() must be askable); the
        # kernels say what is missing when first reached.
        ("triton", "import attnkit.triton as t\nassert t.is_available() is False\n"
                   "t.flash_attention", "triton"),
        ("triton", "from attnkit.triton import decode_attention", "triton"),
        ("torch", "from attnkit.triton import flash_attention", "triton"),
        # attnkit.viz imports without matplotlib (`attnkit trace` needs NumPy only).
        ("matplotlib", "import attnkit.viz as v\nv.plot_attention", "viz"),
        ("matplotlib", "from attnkit.viz import show_heatmaps", "viz"),
        ("transformers", "import attnkit.integrations.transformers", "transformers"),
        ("torch", "from attnkit.integrations.transformers import register", "transformers"),
    ],
)
def test_missing_extra_is_named(missing, code, extra):
    proc = run_without(missing, f"""
        try:
{textwrap.indent(code, " " * 12)}
        except ImportError as err:
            assert type(err) is ImportError, type(err)  # not a bare ModuleNotFoundError
            assert err.name == {missing!r}, err.name
            print(err)
        else:
            raise SystemExit("no ImportError")
    """)
    assert proc.returncode == 0, proc.stderr
    message = proc.stdout.strip()
    assert f"pip install 'attnkit[{extra}]'" in message, message
    assert f"needs {missing}" in message, message


def test_numpy_part_needs_no_extra():
    proc = run_without("torch", """
        sys.modules["matplotlib"] = None
        sys.modules["triton"] = None
        import attnkit.numpy, attnkit.spec, attnkit.triton, attnkit.viz
        from attnkit.viz.trace import trace_shapes
        print("ok")
    """)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_broken_dependency_is_not_called_a_missing_extra():
    """An ImportError from inside an installed package is passed on unchanged: installing
    the extra again would not fix it."""
    from attnkit._optional import raise_missing

    err = ModuleNotFoundError("No module named 'sympy'", name="sympy")
    with pytest.raises(ModuleNotFoundError, match="sympy") as info:
        raise_missing(err, "torch", extra="torch", user="attnkit.torch")
    assert info.value is err


@pytest.mark.parametrize("package", ["attnkit.triton", "attnkit.viz"])
def test_dir_lists_lazy_public_names(package):
    """Names loaded on first use still show in dir() (tab completion, help())."""
    import importlib

    module = importlib.import_module(package)
    listed = dir(module)
    missing = [name for name in module.__all__ if name not in listed]
    assert not missing, f"dir({package}) lacks {missing}"
    assert listed == sorted(listed)
