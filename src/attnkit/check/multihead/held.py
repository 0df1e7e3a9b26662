"""The modules and tensors a module keeps in plain containers (a list of heads, a dict of
buffers), which ``nn.Module`` does not register: what the registration probe of
:mod:`attnkit.check.multihead.probe` looks for."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

__all__ = ["held"]


def held(value: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    """``(path, object)`` of the modules and tensors inside ``value``'s plain lists, tuples
    and dicts (two levels deep; a module at depth 0 is ``value`` itself, not yielded).

    Args:
        value: an attribute of the module under check.
        path: its name, to which ``[i]`` / ``['key']`` are added.
        depth: how deep ``value`` already is (0 for the attribute).

    Yields:
        ``(path, module or tensor)``.
    """
    if isinstance(value, (nn.Module, torch.Tensor)):
        if depth > 0 or isinstance(value, torch.Tensor):
            yield path, value
        return
    if depth > 2:
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from held(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from held(item, f"{path}[{key!r}]", depth + 1)
