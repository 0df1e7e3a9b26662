"""Recording the attention calls of any PyTorch model, one call at a time.

:class:`CallRecorder` is a :class:`torch.overrides.TorchFunctionMode`: while it is active,
every call of :func:`torch.nn.functional.scaled_dot_product_attention` and of the
``flex_attention`` operator is handed to it, wherever the model's code calls them from
(nothing of the model is patched). Forward hooks on every module (``with_kwargs=True`` on
:class:`torch.nn.MultiheadAttention`) say which module a call came from, and give each
``nn.MultiheadAttention`` call whole: its inputs, its weights and its output (the SDPA call
it makes inside is part of it, not a call of its own).

Each call is passed to ``on_call`` as an :class:`AttentionCall` right after it ran and is
dropped after it: memory holds one layer's inputs at a time, however deep the model.
"""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..catalogue import T

__all__ = ["SDPA_PARAMETERS", "AttentionCall", "CallRecorder", "attention_modules",
           "implementation_for"]

# The parameters of torch.nn.functional.scaled_dot_product_attention, in order.
SDPA_PARAMETERS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale",
                   "enable_gqa")


@contextlib.contextmanager
def eager_flex() -> Iterator[None]:
    """``flex_attention`` runs its operator eagerly (not compiled) inside the block."""
    try:
        import torch.nn.attention.flex_attention as fa
    except ImportError:  # a torch without flex_attention: nothing to switch
        yield
        return
    name = "_FLEX_ATTENTION_DISABLE_COMPILE_DEBUG"
    before = getattr(fa, name, None)
    if before is None:
        yield
        return
    setattr(fa, name, True)
    try:
        yield
    finally:
        setattr(fa, name, before)


@dataclass
class AttentionCall:
    """One recorded call.

    Attributes:
        kind: ``"sdpa"``, ``"flex"`` or ``"mha"`` (an ``nn.MultiheadAttention`` forward).
        layer: the qualified name of the module the call came from (``"blocks.3.attn"``;
            ``""`` for the model itself).
        index: the call's number within the run (0, 1, ...).
        arguments: SDPA: its arguments by name (:data:`SDPA_PARAMETERS`), tensors as
            received (detached copies taken before the call); MHA: ``query``, ``key``,
            ``value`` and the keyword arguments of the forward; flex: ``query``, ``key``,
            ``value``, ``score_mod``, ``block_mask``, ``scale`` and the other buffers.
        output: what the call returned (the first element where it returns a tuple), or
            None when it raised.
        error: the exception it raised, or None.
        function: what ran: the torch function, or the implementation under test.
        module: the module (MHA: the ``nn.MultiheadAttention`` itself).
        mutated: names of tensor arguments the call wrote into.
        positional, keywords: SDPA: how many arguments the model passed by position, and
            the names of those it passed by keyword (a rerun passes them the same way).
    """

    kind: str
    layer: str
    index: int
    arguments: dict[str, Any]
    output: Any = None
    error: BaseException | None = None
    function: Any = None
    module: Any = None
    mutated: list[str] = field(default_factory=list)
    positional: int = 0
    keywords: list[str] = field(default_factory=list)


def implementation_for(implementation: Any, layer: str) -> Callable | None:
    """The function that runs in place of SDPA for a call from ``layer``: ``implementation``
    itself when it is callable, else the value of the first pattern of the mapping that
    matches ``layer`` (``fnmatch``: ``"blocks.1.attn"``, ``"blocks.*.attn"``), else None
    (torch's own SDPA runs)."""
    if implementation is None:
        return None
    if callable(implementation):
        return implementation
    if isinstance(implementation, Mapping):
        for pattern, fn in implementation.items():
            if layer == pattern or fnmatch.fnmatchcase(layer, pattern):
                return fn
        return None
    raise TypeError(T("any.bad-implementation", type=type(implementation).__name__))


_NAMED = re.compile(r"(attn|attention)(_?\d+)?$", re.IGNORECASE)


def _is_mha(module: Any) -> bool:
    import torch

    return isinstance(module, torch.nn.MultiheadAttention)


def attention_modules(model: Any) -> dict[str, str]:
    """The modules of ``model`` that look like attention, found by walking it: every
    ``nn.MultiheadAttention`` (``"nn.MultiheadAttention"``), and every module of a class
    not from torch itself whose attribute or class name ends in ``attn`` or ``attention``
    (``self_attn``, ``cross_attn``, ``CausalSelfAttention``; not ``attn_norm`` nor
    ``post_attention_layernorm``), the innermost of a nest (``"named like attention"``),
    never one inside an ``nn.MultiheadAttention``.

    Returns:
        ``{qualified name: why it is listed}``.
    """
    found: dict[str, str] = {}
    mha = [n for n, m in model.named_modules() if _is_mha(m)]
    for name, module in model.named_modules():
        if _is_mha(module):
            found[name] = "nn.MultiheadAttention"
            continue
        if any(name.startswith(p + ".") for p in mha):
            continue
        if type(module).__module__.startswith("torch."):
            continue
        if _NAMED.search(name.rsplit(".", 1)[-1]) or _NAMED.search(type(module).__name__):
            found[name] = T("any.named-like")
    # the innermost of a nest: an outer "attention" that holds another is a container
    return {n: why for n, why in found.items()
            if not any(o != n and o.startswith(n + ".") for o in found)}


class CallRecorder:
    """Records the attention calls of ``model`` while used as a context manager.

    Args:
        model: any ``nn.Module``.
        on_call: called with each :class:`AttentionCall` right after the call ran (it
            may raise to stop the model: the exception goes through the model's forward).
        implementation: None (SDPA calls run torch's SDPA), a function with SDPA's
            signature that runs in place of every SDPA call, or a mapping of layer
            patterns to such functions (see :func:`implementation_for`).

    Attributes:
        ran: ``{module name: forward calls}`` for every module that ran.
        callers: names of the modules calls came from.
    """

    def __init__(self, model: Any, on_call: Callable[[AttentionCall], None],
                 implementation: Any = None) -> None:
        self.model = model
        self.on_call = on_call
        self.implementation = implementation
        self.stack: list[str] = []
        self.inside_mha = 0
        self.handles: list[Any] = []
        self.ran: dict[str, int] = {}
        self.callers: list[str] = []
        self.count = 0
        self.mode: Any = None
        self.paused = False
        self._mha_args: list[tuple] = []

    # -- where a call comes from ---------------------------------------------------------
    def _push(self, name: str) -> Callable:
        def pre(module: Any, args: Any) -> None:
            if self.paused:
                return
            self.stack.append(name)
            self.ran[name] = self.ran.get(name, 0) + 1

        return pre

    def _pop(self, module: Any, args: Any, output: Any) -> None:
        if self.stack and not self.paused:
            self.stack.pop()

    def _mha_pre(self, name: str) -> Callable:
        def pre(module: Any, args: tuple, kwargs: dict) -> None:
            if self.paused:
                return
            self.inside_mha += 1
            self._mha_args.append((_snap(args), {n: _snap(x) for n, x in kwargs.items()}))

        return pre

    def _mha_post(self, name: str) -> Callable:
        def post(module: Any, args: tuple, kwargs: dict, output: Any = None) -> None:
            if self.paused or not self._mha_args:
                return
            self.inside_mha -= 1
            snap_args, snap_kwargs = self._mha_args.pop()
            if self.inside_mha:
                return  # an MHA inside another: judged as part of the outer one
            names = ("query", "key", "value")
            arguments = dict(zip(names, snap_args))
            arguments.update(snap_kwargs)
            for extra, x in zip(list(inspect.signature(module.forward).parameters)[3:],
                                snap_args[3:]):
                arguments.setdefault(extra, x)
            out = output[0] if isinstance(output, tuple) else output
            error = None
            if output is None:  # always_call: the forward raised, and is raising
                error = sys.exc_info()[1] or RuntimeError(
                    T("any.forward-raised", name=type(module).__name__))
            self._emit(AttentionCall("mha", name, self.count, arguments, _detached(out),
                                     error, type(module).forward, module))

        return post

    # -- the mode --------------------------------------------------------------------------
    def _emit(self, call: AttentionCall) -> None:
        self.count += 1
        if call.layer not in self.callers:
            self.callers.append(call.layer)
        self.paused = True  # judging runs torch (and may rerun the call): not recorded
        try:
            self.on_call(call)
        finally:
            self.paused = False

    def handle(self, func: Any, args: tuple, kwargs: dict) -> Any:
        """Run one intercepted call (inside the mode, with the mode off)."""
        import torch.nn.functional as F

        layer = self.stack[-1] if self.stack else ""
        if self.inside_mha or self.paused:  # inside nn.MultiheadAttention: part of its call
            return func(*args, **kwargs)
        if func is F.scaled_dot_product_attention:
            arguments = _bind_sdpa(args, kwargs)
            fn = implementation_for(self.implementation, layer) or func
            kind = "sdpa"
        else:
            arguments = {"args": args}
            fn, kind = func, "flex"
        snap = {n: _snap(x) for n, x in arguments.items()} if kind == "sdpa" else \
            {"args": _snap(args)}
        call = AttentionCall(kind, layer, self.count, snap, function=fn,
                             module=_module_named(self.model, layer), positional=len(args),
                             keywords=list(kwargs))
        try:
            result = fn(*args, **kwargs)
        except Exception as err:  # the implementation under test may raise anything
            call.error = err
            self._emit(call)
            raise
        call.output = _detached(result[0] if isinstance(result, tuple) else result)
        if kind == "sdpa":
            call.mutated = [n for n in ("query", "key", "value")
                            if not _same(snap[n], arguments[n])]
        self._emit(call)
        return result

    def __enter__(self) -> CallRecorder:
        import torch
        from torch.overrides import TorchFunctionMode

        recorder = self

        class _Mode(TorchFunctionMode):
            def __torch_function__(self, func: Any, types: Any, args: tuple = (),
                                   kwargs: dict | None = None) -> Any:
                kwargs = kwargs or {}
                if _is_attention(func):
                    return recorder.handle(func, args, kwargs)
                return func(*args, **kwargs)

        for name, module in self.model.named_modules():
            try:
                pre = module.register_forward_pre_hook(self._push(name))
            except (RuntimeError, AttributeError, TypeError):  # a scripted module: no hooks
                continue
            try:
                self.handles += [pre, module.register_forward_hook(self._pop, always_call=True)]
            except (RuntimeError, AttributeError, TypeError):
                pre.remove()
                continue
            if _is_mha(module):
                self.handles.append(module.register_forward_pre_hook(
                    self._mha_pre(name), with_kwargs=True))
                self.handles.append(module.register_forward_hook(
                    self._mha_post(name), with_kwargs=True, always_call=True))
        self.flex = eager_flex()  # flex_attention runs its operator, uncompiled, to reach us
        self.flex.__enter__()
        self.mode = _Mode()
        self.mode.__enter__()
        del torch
        return self

    def __exit__(self, *exc: Any) -> None:
        self.mode.__exit__(*exc)
        self.flex.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles.clear()
        self.stack.clear()
        self.inside_mha = 0
        self._mha_args.clear()


def _is_attention(func: Any) -> bool:
    import torch.nn.functional as F

    if func is F.scaled_dot_product_attention:
        return True
    return type(func).__name__ == "FlexAttentionHOP" or (
        getattr(func, "_name", None) == "flex_attention"
        and type(func).__module__.startswith("torch._higher_order_ops"))


def _bind_sdpa(args: tuple, kwargs: dict) -> dict[str, Any]:
    """SDPA's arguments by name, defaults filled in."""
    out: dict[str, Any] = {"attn_mask": None, "dropout_p": 0.0, "is_causal": False,
                           "scale": None, "enable_gqa": False}
    out.update(zip(SDPA_PARAMETERS, args))
    out.update(kwargs)
    return out


def _module_named(model: Any, name: str) -> Any:
    try:
        return model.get_submodule(name) if name else model
    except AttributeError:
        return None


def _snap(x: Any) -> Any:
    """A detached copy of a tensor (tensors in tuples and lists too); anything else as is."""
    import torch

    if isinstance(x, torch.Tensor):
        return x.detach().clone()
    if isinstance(x, (tuple, list)):
        return type(x)(_snap(y) for y in x)
    return x


def _detached(x: Any) -> Any:
    import torch

    return x.detach() if isinstance(x, torch.Tensor) else x


def _same(a: Any, b: Any) -> bool:
    """Equal, NaN where NaN (a snapshot taken before a call vs the tensor after it)."""
    import torch

    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return True
    b = b.detach()
    if a.shape != b.shape:
        return False
    nan = torch.isnan(a)
    return bool(torch.equal(nan, torch.isnan(b)) and torch.equal(a[~nan], b[~nan]))
