"""The wrappers ``check_model`` registers with transformers' ``AttentionInterface``: one per
implementation under test, named ``attnkit-check-<name>``, each calling the implementation
and handing the call to the check; and the check's own failures kept apart from the
implementation's."""

from __future__ import annotations

import sys
from typing import Any

from ..catalogue import T
from .report import ImplementationResult, LayerRow, ModelFinding

__all__ = ["WRAPPER_PREFIX", "CheckFailed", "Session", "Stopped", "first_line",
           "known_implementations", "register_wrapper", "unregister_wrappers"]

WRAPPER_PREFIX = "attnkit-check-"


class Stopped(Exception):
    """Raised through the model when the implementation under test raised."""


class CheckFailed(Exception):
    """Raised through the model when judging a call failed (a gap in attnkit's check)."""


# -- the wrapper ------------------------------------------------------------------------------
class Session:
    """One implementation's run: the wrapper registered for it calls :meth:`attention`."""

    def __init__(self, check: Any, impl: str, reference: bool) -> None:
        self.check, self.impl, self.reference = check, impl, reference
        self.result = ImplementationResult(impl)
        self.rows: dict[str, LayerRow] = {}
        self.found: list[ModelFinding] = []  # the run's first finding of each code
        self.first_fail_key: tuple | None = None
        self.step = 0
        self.call_index = 0
        self.path = ""  # "model.generate(), static cache" while that path runs
        self.sdpa_masks = _sdpa_masks(impl)  # a None mask means PyTorch's is_causal

    def function(self, module: Any) -> Any:
        if self.impl == "eager":
            fn = getattr(sys.modules.get(type(module).__module__), "eager_attention_forward",
                         None)
            if fn is None:
                raise Stopped(T("model.no-eager", module=type(module).__module__))
            return fn
        from transformers import AttentionInterface

        return AttentionInterface()[self.impl]

    def attention(self, module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                  *args: Any, **kwargs: Any) -> Any:
        fn = self.function(module)
        self.check.bar.set_postfix_str(
            f"{self.impl}, step {self.step}, {self.check.names.get(id(module), '')}",
            refresh=False)
        snap = [t.detach().clone() for t in (query, key, value)]
        index = self.call_index
        self.call_index += 1
        try:
            result = fn(module, query, key, value, attention_mask, *args, **kwargs)
        except Exception as err:  # the implementation under test may raise anything
            self.check.raised(self, module, snap, attention_mask, kwargs, fn, err)
            raise Stopped(f"{type(err).__name__}: {first_line(err)}") from err
        mutated = [n for n, a, b in zip("qkv", snap, (query, key, value))
                   if not _same(a, b)]
        try:
            self.check.judge(self, module, index, snap, attention_mask, kwargs, result,
                             mutated, fn)
        except Exception as err:  # attnkit's own failure: say so, never blame the function
            raise CheckFailed(f"{type(err).__name__}: {first_line(err)}") from err
        return result


def _sdpa_masks(impl: str) -> bool:
    """Does ``impl`` get its masks from transformers' ``sdpa_mask`` (so that a None mask
    with ``is_causal`` means PyTorch's top-left ``is_causal``)?"""
    try:
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    except ImportError:
        return False
    return AttentionMaskInterface._global_mapping.get(impl) is sdpa_mask


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN where NaN (a snapshot taken before the call vs the tensor after it)."""
    import torch

    b = b.detach()
    if a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))


def first_line(err: BaseException) -> str:
    """The first sentence of the first line of an error, at most 200 characters."""
    line = (str(err).strip().splitlines() or [""])[0]
    end = line.find(". ", 40)
    return (line[:end + 1] if 0 < end < 200 else line[:200]).strip()


# -- the check --------------------------------------------------------------------------------


SESSIONS: dict[str, Any] = {}


def register_wrapper(impl: str, session: Session) -> str:
    """Register the wrapper of ``impl`` (and ``impl``'s mask function) under
    ``attnkit-check-<impl>``; the wrapper forwards to ``session``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if impl == "attnkit":
        from ...integrations.transformers import register

        register()
    name = WRAPPER_PREFIX + impl
    SESSIONS[name] = session

    def wrapper(module: Any, query: Any, key: Any, value: Any, attention_mask: Any,
                *args: Any, **kwargs: Any) -> Any:
        return SESSIONS[name].attention(module, query, key, value, attention_mask, *args,
                                         **kwargs)

    if impl != "eager" and impl not in AttentionInterface():
        raise ValueError(T("load.unknown-implementation", name=impl, known=", ".join(
            ["eager", *AttentionInterface().valid_keys()])))
    for iface in (AttentionInterface, AttentionMaskInterface):  # put back by unregister
        _BEFORE.setdefault((iface, name), iface._global_mapping.get(name, _NONE))
    AttentionInterface.register(name, wrapper)
    masks = AttentionMaskInterface()
    if impl in masks:
        AttentionMaskInterface.register(name, masks[impl])
    return name


_NONE = object()
_BEFORE: dict[tuple[Any, str], Any] = {}


def unregister_wrappers() -> None:
    """Take the ``attnkit-check-*`` wrappers out of transformers' global
    ``AttentionInterface`` and ``AttentionMaskInterface`` again (putting back whatever
    was registered under the name before), and forget their sessions."""
    for (iface, name), value in list(_BEFORE.items()):
        if value is _NONE:
            iface._global_mapping.pop(name, None)
        else:
            iface._global_mapping[name] = value
        SESSIONS.pop(name, None)
        del _BEFORE[(iface, name)]


def known_implementations(impls: list[str]) -> None:
    from transformers import AttentionInterface

    if "attnkit" in impls:
        from ...integrations.transformers import register

        register()
    known = ["eager"] + [n for n in AttentionInterface().valid_keys()
                         if not n.startswith(WRAPPER_PREFIX)]
    unknown = [n for n in impls if n not in known]
    if unknown:
        raise ValueError(T("load.unknown-implementations", names=str(unknown),
                           known=", ".join(known)))
