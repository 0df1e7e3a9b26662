"""Which torch build `make demo` / `make test` install here, and the pip arguments for it.

The choice is :mod:`attnkit.torch_build` (``src/attnkit/torch_build.py``), which the
notebooks' first cell calls too, so that both install the same build; its docstring says
what it chooses on each machine and why. This script runs it from this clone's ``src/``,
before attnkit is installed (importing attnkit and that module takes the standard library
only): the explanation goes to stderr, the pip arguments to stdout, one per line.

Usage: ``python tools/torch_build.py [--lock requirements.lock]``; ``--installed`` says
which build is installed. ``TORCH=cpu|cuda|pypi`` overrides the detection,
``TORCH_CPU_INDEX`` names another CPU index.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from attnkit.torch_build import (  # noqa: E402,F401 (names for tools/platforms.py and tests)
    CHOICES,
    CPU_INDEX,
    PROBE_TIMEOUT_S,
    Choice,
    choose,
    detect,
    installed,
    locked_torch,
    main,
    nvidia_gpu,
    probe,
)

if __name__ == "__main__":
    sys.exit(main())
