"""attnkit.check: test anyone's softmax, attention or multi-head attention against the oracle,
and say what is wrong in words.

::

    from attnkit.check import check_attention
    report = check_attention(my_attention)          # NumPy or PyTorch, detected
    print(report)                                   # a table, and a reproducer per finding
    assert report.ok, report.codes

The same from a shell: ``attnkit check attention my_file.py:my_attention`` (or
``notes.ipynb:name``, ``file.py:layer.forward``, a class, a factory). Each finding
has a stable code (:data:`CODES`), a one-line diagnosis, the measured error against the
2x/3x/5x rule, and a reproducer that shows the bug when run as printed.
"""

from __future__ import annotations

from .block.check import check_block
from .catalogue import get_language, set_language
from .core.report import CODES, Finding, Report
from .function.check import check_attention, check_masked_softmax, check_softmax
from .meet.adapt import CONVENTIONS
from .meet.targets import TargetLoadError, load_target
from .multihead.check import check_multi_head

CHECKS = {
    "softmax": check_softmax,
    "masked-softmax": check_masked_softmax,
    "attention": check_attention,
    "multi-head": check_multi_head,
}


def __getattr__(name: str) -> object:
    """``check_model`` and ``ModelReport`` on first use: they need torch and transformers,
    which checking a NumPy function does not."""
    if name in ("check_model", "ModelReport"):
        from .model import check

        return getattr(check, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHECKS",
    "CODES",
    "CONVENTIONS",
    "ModelReport",
    "Finding",
    "Report",
    "TargetLoadError",
    "check_attention",
    "check_block",
    "check_masked_softmax",
    "check_model",
    "check_multi_head",
    "check_softmax",
    "get_language",
    "load_target",
    "set_language",
]
