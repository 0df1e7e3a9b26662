"""Every attention layer of the model accounted for: the attention modules are found by
walking the model (not only from the calls that arrived), and a module no call of which
was judged gets a row "not checked" with the reason, which keeps the report from passing."""

from __future__ import annotations

from typing import Any

from .report import LayerRow

__all__ = ["NOT_CHECKED", "account", "attention_modules"]

NOT_CHECKED = "not checked"


def _is_attention(module: Any) -> bool:
    return type(module).__name__.lower().endswith("attention")


def attention_modules(model: Any) -> list[str]:
    """The names of ``model``'s attention modules, in module order: those whose class name
    ends in ``Attention`` and that hold no such module themselves (``BertAttention`` holds
    ``BertSelfAttention``, which is the one that calls the attention function)."""
    names = []
    for name, module in model.named_modules():
        if _is_attention(module) and not any(_is_attention(m) for _, m in
                                             module.named_modules() if m is not module):
            names.append(name)
    return names


def account(check: Any, session: Any) -> None:
    """Add a "not checked" row for each attention module of ``check.model`` that no judged
    call came from (``session``: one implementation's run that got to run the model), and
    put the rows in module order."""
    result = session.result
    if result.status.startswith(("refused", "not judged")):
        return  # nothing ran: the implementation's note says why
    order = {name: i for i, (name, _) in enumerate(check.model.named_modules())}
    stopped = result.status.startswith("stopped")
    for name in attention_modules(check.model):
        if name in session.rows:
            continue
        row = LayerRow(name, verdict=NOT_CHECKED)
        row.why = ("the run stopped before it" if stopped else
                   "no call of it reached transformers' AttentionInterface (its forward "
                   "computes attention itself, or it did not run on these inputs)")
        session.rows[name] = row
        result.layers.append(row)
    result.layers.sort(key=lambda r: order.get(r.layer, len(order)))
