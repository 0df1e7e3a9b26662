"""A wrong example and its fix for every code, as code that runs: the reference page of each
code (``python -m attnkit.check.catalogue --write-docs``) shows them, and the docs test runs
them, so the wrong one is shown failing the check and the fix passing it."""

from __future__ import annotations

from .blocks import EXAMPLES as _BLOCKS
from .functions import EXAMPLES as _FUNCTIONS
from .modules import EXAMPLES as _MODULES

__all__ = ["EXAMPLES"]

# code -> (wrong, fix): each a complete program (imports included).
EXAMPLES: dict[str, tuple[str, str]] = {**_FUNCTIONS, **_MODULES, **_BLOCKS}
