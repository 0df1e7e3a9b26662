"""Accounting for every attention layer of a model: the attention modules found by walking
it, against the modules whose calls were judged; a module never judged is named with the
reason ("not checked: ..."), never passed in silence. Used by ``check_model`` on any
PyTorch model; kept apart so that every kind of model check can use it."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..catalogue import T

__all__ = ["NOT_CHECKED", "account", "not_checked"]

NOT_CHECKED = "not checked"

_INLINE = T("any.inline")


def _related(a: str, b: str) -> bool:
    """``a`` is ``b``, inside it, or holds it (``""`` is the model: it holds everything)."""
    if a == b or not a or not b:
        return True
    return a.startswith(b + ".") or b.startswith(a + ".")


def not_checked(found: Mapping[str, str], judged: Iterable[str], ran: Mapping[str, int],
                inline: str = _INLINE,
                not_ran: str = T("any.not-ran")) -> dict[str, str]:
    """The attention modules no judged call accounts for, with why.

    Args:
        found: ``{module name: why it counts as attention}`` (from walking the model).
        judged: names of the modules calls were judged for (a call from a module counts
            for the modules inside it and around it: a wrapper, the function it calls).
        ran: ``{module name: forward calls}`` of the run.
        inline: the reason given for a module that ran and made no call.
        not_ran: the reason given for a module that did not run.

    Returns:
        ``{module name: reason}``, in the model's order.
    """
    judged = list(judged)
    out: dict[str, str] = {}
    for name in found:
        if any(_related(name, j) and j for j in judged):
            continue
        if not ran.get(name):
            out[name] = not_ran
        else:
            out[name] = inline
    return out


_NO_INTERFACE = T("any.no-interface")


def account(check: Any, session: Any) -> None:
    """A transformers model: add a "not checked" row, with why, for each attention module
    of ``check.model`` (found by walking it) that no judged call of ``session`` (one
    implementation's run that got to run the model) accounts for; rows in module order."""
    from .report import LayerRow
    from .torch_calls import attention_modules

    result = session.result
    if result.status.startswith(("refused", "not judged")):
        return  # nothing ran: the implementation's note says why
    found = attention_modules(check.model)
    stopped = result.status.startswith("stopped")
    missing = not_checked(found, session.rows, {name: 1 for name in found},
                          inline=T("any.stopped-before") if stopped else _NO_INTERFACE)
    for name, why in missing.items():
        row = session.rows[name] = LayerRow(name, verdict=NOT_CHECKED, note=why)
        result.layers.append(row)
    order = {name: i for i, (name, _) in enumerate(check.model.named_modules())}
    result.layers.sort(key=lambda r: order.get(r.layer, len(order)))
