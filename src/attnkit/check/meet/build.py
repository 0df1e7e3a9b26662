"""Building what the user named: a class (its constructor read off its signature), a config
object (off its dataclass fields), a factory function, or an instance as it is.

A multi-head attention class is built at width 16 with 4 heads. Which constructor parameter
is which is read off its name:

===============  =============================================================================
width            ``d_model``, ``embed_dim``, ``hidden_size``, ``num_hiddens``, ``n_embd``,
                 ``dim``, ``embed_size``, ``model_dim``, ``hidden_dim``, ``query_size`` ...
head count       ``h``, ``heads``, ``num_heads``, ``n_head``, ``n_heads``, ``head_num`` ...
per-head size    ``d_k``, ``d_v``, ``head_size``, ``head_dim``, ``d_head``, ``dim_head`` ...
                 (width / heads)
dropout          any name with ``drop`` in it (``dropout``, ``dropout_rate``, ``attn_pdrop``): 0
a config object  ``config``, ``cfg``, ``args`` ... or an annotated class: built from its
                 dataclass fields (or its own constructor) by the same names
===============  =============================================================================

Other parameters keep their defaults; a required one no rule names (a length such as
``block_size`` gets 64, a required ``bias`` True) stops the build with one line that names
the signature and shows the factory to write instead.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..catalogue import T, Text

__all__ = ["BuildError", "Built", "build_callable", "build_module", "safe_copy"]

WIDTH_NAMES = frozenset((
    "d_model", "embed_dim", "hidden_size", "num_hiddens", "n_embd", "n_embed", "dim",
    "embed_size", "model_dim", "hidden_dim", "d_embed", "emb_dim", "emb_size", "embedding_dim",
    "embedding_size", "dim_model", "model_size", "d_hidden", "hidden", "hid_dim", "n_hidden",
    "input_dim", "in_dim", "in_features", "query_dim", "query_size", "key_size", "value_size",
    "n_state", "nx", "width", "dmodel", "e", "embed", "features", "n_embed_dim", "d_in",
    "dim_model", "model_dimension", "hidden_units", "units"))
HEAD_NAMES = frozenset((
    "h", "heads", "num_heads", "n_head", "n_heads", "head_num", "num_head", "nhead", "nheads",
    "num_attention_heads", "attention_heads", "head_count", "heads_num", "n_attn_heads",
    "num_attn_heads", "n_heads_q", "nh", "n_h", "number_of_heads", "attn_heads"))
PER_HEAD_NAMES = frozenset((
    "d_k", "d_v", "d_q", "dk", "dv", "head_size", "head_dim", "d_head", "dim_head",
    "dim_per_head", "d_kv", "attention_head_size", "size_per_head", "head_dims", "qk_dim",
    "v_dim", "d_key", "d_value", "dim_key", "dim_value", "dim_k", "dim_v", "key_dim",
    "value_dim"))
LENGTH_NAMES = frozenset((
    "block_size", "max_len", "max_seq_len", "max_length", "max_seq_length", "context_length",
    "context_size", "n_positions", "n_ctx", "seq_len", "max_position_embeddings", "maxlen",
    "max_positions", "seq_length"))
BIAS_NAMES = frozenset(("bias", "use_bias", "qkv_bias", "add_bias"))
CAUSAL_FLAGS = ("causal", "is_causal")
CONFIG_NAMES = frozenset((
    "config", "cfg", "conf", "configs", "args", "hparams", "params", "opt", "opts", "hp",
    "settings", "model_config", "attn_config"))
LENGTH = 64  # longer than any sequence the checks run


class BuildError(Exception):
    """The target cannot be built from its signature: the message (``.text``, a sentence
    of the catalogue) says why and shows the factory to write instead."""

    def __init__(self, text: Text) -> None:
        super().__init__(str(text))
        self.text = text


@dataclass
class Built:
    """What the checker runs, and how to build it again.

    Attributes:
        obj: the module (or callable) built.
        how: one line for the report (``"built as MHA(h=4, d_model=16, dropout=0.0)"``).
        expr: source text that builds it again, using the names ``load_lines`` bind
            (``"MHA(h=4, d_model=16, dropout=0.0)"``); empty when it cannot be named.
        load_lines: lines that bind those names (``"MHA = load_target('m.py:MHA')"``).
        rebuild: ``rebuild(seed=0)`` builds a fresh one the same way (seeded: the same
            weights for the same seed).
        args: the constructor's arguments (``"embed_dim=16, num_hiddens=16"``) where they
            need no other name: a class defined in a notebook is rebuilt with them.
    """

    obj: Any
    how: Text
    expr: str = ""
    load_lines: list[str] = field(default_factory=list)
    rebuild: Callable[..., Any] | None = None
    args: str = ""


def _role(name: str) -> str | None:
    n = name.lower()
    if n in WIDTH_NAMES:
        return "width"
    if n in HEAD_NAMES:
        return "heads"
    if n in PER_HEAD_NAMES:
        return "per_head"
    if "drop" in n:
        return "dropout"
    if n in LENGTH_NAMES:
        return "length"
    if n in BIAS_NAMES:
        return "bias"
    return None


def _signature_text(fn: Any) -> str:
    try:
        return f"{getattr(fn, '__name__', 'target')}{inspect.signature(fn)}"
    except (TypeError, ValueError):
        return f"{getattr(fn, '__name__', 'target')}(...)"


def _factory_call(fn: Any) -> str:
    """``MyMHA(H, E, vocab=...)``: the call a factory ``make(E, H)`` would make, each
    required parameter filled by its name's rule, the others left for the user."""
    name = getattr(fn, "__name__", "MyAttention")
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return f"{name}(...)"
    fill = {"width": "E", "heads": "H", "per_head": "E // H", "dropout": "0.0"}
    args: list[str] = []
    keyword = False  # once one argument goes by name, the rest do too
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or (
                p.default is not inspect.Parameter.empty and _role(p.name) not in fill):
            continue
        value = fill.get(_role(p.name) or "", "...")
        keyword = keyword or p.kind is p.KEYWORD_ONLY or value in ("...", "0.0")
        args.append(f"{p.name}={value}" if keyword else value)
    return f"{name}({', '.join(args)})"


def _factory_hint(fn: Any, spec: str | None, multi_head: bool) -> Text:
    name = getattr(fn, "__name__", "MyAttention")
    where = (spec or "my_file.py:x").rsplit(":", 1)[0]
    if multi_head:
        return T("build.hint-factory", call=_factory_call(fn), where=where)
    return T("build.hint-instance", name=name, where=where)


def _spec_of(obj: Any) -> str | None:
    from .targets import target_spec

    return target_spec(obj)


class _Args:
    """Arguments for one call, as values (made afresh on each call) and as source text."""

    def __init__(self) -> None:
        self.parts: list[tuple[inspect.Parameter | None, Callable[[], Any], str]] = []
        self.loads: list[str] = []
        self.roles: set[str] = set()

    def add(self, param: inspect.Parameter | None, make: Callable[[], Any], text: str) -> None:
        self.parts.append((param, make, text))

    @property
    def text(self) -> str:
        return ", ".join(t if p is None or p.kind is p.POSITIONAL_ONLY else f"{p.name}={t}"
                         for p, _, t in self.parts)

    def call(self, fn: Any) -> Any:
        args = [make() for p, make, _ in self.parts if p is None or p.kind is p.POSITIONAL_ONLY]
        kwargs = {p.name: make() for p, make, _ in self.parts
                  if p is not None and p.kind is not p.POSITIONAL_ONLY}
        return fn(*args, **kwargs)


def _config_class(fn: Any, param: inspect.Parameter) -> Any:
    """The class a config parameter wants: its annotation, else a dataclass in the target's
    module whose fields name a width and a head count."""
    ann = None if param.annotation is param.empty else param.annotation
    module = sys.modules.get(getattr(fn, "__module__", "") or "")
    if isinstance(ann, str) and module is not None:
        ann = vars(module).get(ann.split(".")[-1].strip("'\""), None)
    if inspect.isclass(ann) and ann.__module__ != "builtins":
        return ann
    if module is None:
        return None
    found = []
    for value in vars(module).values():
        if not inspect.isclass(value) or value is fn or callable(getattr(value, "forward", None)):
            continue
        if dataclasses.is_dataclass(value):
            names = {f.name.lower() for f in dataclasses.fields(value)}
        elif value.__module__ == module.__name__:  # a plain config class of the same file
            try:
                names = {n.lower() for n in inspect.signature(value).parameters}
            except (TypeError, ValueError):
                continue
        else:
            continue
        if names & WIDTH_NAMES and names & HEAD_NAMES:
            found.append((names, value))
    if not found:
        return None
    # Several config classes in one file: the one whose fields the constructor reads.
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        source = ""
    read = {n.lower() for n in re.findall(rf"\b{re.escape(param.name)}\.(\w+)", source)}
    return max(found, key=lambda f: (len(read & f[0]) - len(read - f[0]),
                                     dataclasses.is_dataclass(f[1])))[1]


def _arguments(fn: Any, width: int | None, heads: int | None, spec: str | None,
               multi_head: bool, depth: int = 0, causal: bool = False) -> _Args:
    """The arguments that build ``fn`` (a class or a function), read off its signature;
    ``causal``: a boolean ``causal``/``is_causal`` parameter (or config field) gets True."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as err:
        raise BuildError(T("build.no-signature", name=str(getattr(fn, "__name__", fn)),
                           error=str(err), hint=_factory_hint(fn, spec, multi_head))) from err
    out = _Args()
    values = {"width": width, "heads": heads,
              "per_head": width // heads if width and heads else None, "dropout": 0.0}
    roles = {_role(p.name) for p in params}
    if "width" not in roles and "heads" in roles and "per_head" in roles:
        # (head_size, num_heads) with no width: the size named is the whole width.
        values["per_head"] = width
    unknown: list[inspect.Parameter] = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        required = p.default is inspect.Parameter.empty
        role = _role(p.name)
        if causal and p.name.lower() in CAUSAL_FLAGS and isinstance(p.default, bool):
            out.add(p, lambda: True, "True")  # declared causal: the constructor's switch on
        elif role in values and values[role] is not None:
            value = values[role]
            out.add(p, lambda value=value: value, repr(value))
            out.roles.add(role)
        elif not required:
            continue
        elif role == "length":
            out.add(p, lambda: LENGTH, str(LENGTH))
        elif role == "bias":
            out.add(p, lambda: True, "True")
        elif depth == 0 and (p.name.lower() in CONFIG_NAMES or (
                p.annotation is not p.empty and inspect.isclass(p.annotation))
                or isinstance(p.annotation, str) and p.annotation[:1].isupper()):
            cls = _config_class(fn, p)
            if cls is None:
                raise BuildError(T("build.no-config", signature=_signature_text(fn),
                                   name=p.name, hint=_factory_hint(fn, spec, multi_head)))
            try:
                sub = _arguments(cls, width, heads, spec, multi_head, depth + 1, causal)
            except BuildError as err:  # fields no rule fills: the whole factory, written out
                why = (T("build.why-no-rule", names=err.text.fields["names"])
                       if getattr(err.text, "key", "") == "build.no-rule" else err.text)
                where = (spec or "my_file.py:x").rsplit(":", 1)[0]
                raise BuildError(T(
                    "build.config-fields", signature=_signature_text(fn), name=p.name,
                    cls=cls.__name__, why=why, factory=factory_text(fn),
                    kind="multi-head" if multi_head else "...", where=where)) from None
            cls_spec = _spec_of(cls)
            if cls_spec:
                out.loads.append(f"{cls.__name__} = load_target({cls_spec!r})")
            out.loads += sub.loads
            out.roles |= sub.roles
            out.add(p, lambda cls=cls, sub=sub: sub.call(cls), f"{cls.__name__}({sub.text})")
        else:
            unknown.append(p)
    if not unknown:
        return out
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    first_two = positional[:2]
    if (multi_head and depth == 0 and len(first_two) == 2 and not out.roles & {"width", "heads"}
            and all(p in first_two for p in unknown)
            and all(_role(p.name) is None for p in first_two)):
        # Two parameters no name rule reads: the documented factory(E, H), by position.
        out.parts = [(None, lambda: width, str(width)), (None, lambda: heads, str(heads))] + [
            part for part in out.parts if part[0] not in first_two]
        out.roles |= {"width", "heads"}
        return out
    names = ", ".join(p.name for p in unknown)
    qkv = {"q", "k", "v", "query", "key", "value", "queries", "keys", "values", "x", "scores"}
    if multi_head and depth == 0 and {p.name.lower() for p in unknown} & qkv:
        raise BuildError(T("build.a-function", signature=_signature_text(fn)))
    if not multi_head and {p.name.lower() for p in unknown} & (WIDTH_NAMES | HEAD_NAMES):
        raise BuildError(T("build.a-module", signature=_signature_text(fn)))
    raise BuildError(T("build.no-rule", signature=_signature_text(fn), names=names,
                       hint=_factory_hint(fn, spec, multi_head)))


def _seeded(make: Callable[[], Any]) -> Callable[[int], Any]:
    def build(seed: int = 0) -> Any:
        if "torch" in sys.modules:  # a NumPy class needs no torch
            sys.modules["torch"].manual_seed(seed)
        np.random.seed(seed)
        return make()

    return build


class BuildRaised(Exception):
    """The constructor raised: the exception, the call that raised it (``expr``, with the
    lines ``loads`` that bind the names it uses) and the factory to write instead."""

    def __init__(self, error: Exception, expr: str, loads: list[str], factory: str) -> None:
        super().__init__(str(error))
        self.error, self.expr, self.loads, self.factory = error, expr, loads, factory


def factory_text(target: Any) -> str:
    """``FromConfig(config=MyConfig(E, H, rope=...))``: the call a factory ``make(E, H)``
    makes, a config parameter built from its class's fields."""
    try:
        params = list(inspect.signature(target).parameters.values())
    except (TypeError, ValueError):
        return _factory_call(target)
    for p in params:
        if p.default is inspect.Parameter.empty and p.name.lower() in CONFIG_NAMES:
            cls = _config_class(target, p)
            if cls is not None:
                return f"{_name(target)}({p.name}={_factory_call(cls)})"
    return _factory_call(target)


def build_module(target: Any, width: int, heads: int, spec: str | None,
                 causal: bool = False) -> Built:
    """The multi-head module the checker runs: ``target`` built at ``width`` and ``heads``.

    Args:
        target: a class (its constructor read off its signature), a factory function
            (``factory(E, H)``, or its parameters by name), or an instance (used as it is
            when it is ``width`` wide, else a fresh one of its class).
        width: the embedding width to build (the checks run at 16).
        heads: the head count (4).
        spec: the ``load_target`` string of ``target``, for the reproducers; or None.
        causal: the module is declared causal: a constructor's (or its config's) boolean
            ``causal``/``is_causal`` parameter is set True.

    Returns:
        A :class:`Built`.

    Raises:
        BuildError: the signature says too little; the message shows the factory to write.
        Exception: whatever the constructor raises (the caller reports it).
    """
    load = [f"{_name(target)} = load_target({spec!r})"] if spec else []
    if inspect.isclass(target) or inspect.isroutine(target):
        a = _arguments(target, width, heads, spec, multi_head=True, causal=causal)
        expr = f"{_name(target)}({a.text})"
        rebuild = _seeded(lambda: a.call(target))
        try:
            obj = rebuild()
        except Exception as err:
            raise BuildRaised(err, expr, load + a.loads, factory_text(target)) from err
        return Built(obj, T("build.built-as", expr=expr), expr if spec else "",
                     load + a.loads, rebuild, "" if a.loads else a.text)
    found = _width_of(target)
    reason = T("build.instance-wide", width=found)
    if found in (None, width):
        try:
            safe_copy(target)
        except Exception as err:  # a lock, a file, a generator on self: build one afresh
            reason = T("build.instance-no-copy", error=type(err).__name__)
        else:
            name = spec.rsplit(":", 1)[1] if spec else type(target).__name__
            return Built(target, T("build.as-loaded", name=name), "copy.deepcopy(layer)"
                         if spec else "", ["import copy", f"layer = load_target({spec!r})"]
                         if spec else [], lambda seed=0: safe_copy(target))
    cls = type(target)
    cls_spec = _spec_of(cls)
    a = _arguments(cls, width, heads, cls_spec, multi_head=True)
    expr = f"{cls.__name__}({a.text})"
    rebuild = _seeded(lambda: a.call(cls))
    obj = rebuild()
    loads = [f"{cls.__name__} = load_target({cls_spec!r})"] if cls_spec else []
    return Built(obj, T("build.fresh", expr=expr, width=width, reason=reason),
                 expr if cls_spec else "", loads + a.loads, rebuild)


def build_callable(target: Any, spec: str | None) -> Built | None:
    """A class given where a function is checked, built from its signature (``dropout*``
    0, defaults kept) and put in ``eval()`` mode; None when ``target`` is not a class.

    Raises:
        BuildError: a required parameter no rule fills (``temperature``, ``d_k``...).
    """
    if not inspect.isclass(target):
        return None
    a = _arguments(target, None, None, spec, multi_head=False)
    expr = f"{_name(target)}({a.text})"

    def make() -> Any:
        obj = a.call(target)
        return obj.eval() if callable(getattr(obj, "eval", None)) and hasattr(
            obj, "training") else obj

    rebuild = _seeded(make)
    obj = rebuild()
    evals = ".eval()" if hasattr(obj, "training") else ""
    load = [f"{_name(target)} = load_target({spec!r})"] if spec else []
    return Built(obj, T("build.built-as", expr=f"{expr}{evals}"), f"{expr}{evals}" if spec else "",
                 load + a.loads, rebuild)


def _name(obj: Any) -> str:
    name = getattr(obj, "__name__", None) or type(obj).__name__
    return name if name.isidentifier() else "factory"


def _width_of(m: Any) -> int | None:
    """The width an instance was built with: an attribute named like a width, else the
    input size of its first ``nn.Linear``; None when neither says."""
    for attr in ("embed_dim", "d_model", "hidden_size", "num_hiddens", "n_embd", "dim",
                 "embed_size", "model_dim", "hidden_dim"):
        value = getattr(m, attr, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    for mod in getattr(m, "modules", lambda: [])():
        if hasattr(mod, "in_features") and isinstance(mod.in_features, int):
            return mod.in_features
    return None


def safe_copy(m: Any) -> Any:
    """A deep copy of ``m`` that does not trip on tensors its forward left on ``self``
    (attention weights kept for plotting: not graph leaves, so ``copy.deepcopy`` refuses
    them); those are copied detached."""
    memo: dict[int, Any] = {}
    modules = list(m.modules()) if callable(getattr(m, "modules", None)) else [m]
    for mod in modules:
        for value in list(vars(mod).values()):
            items = value if isinstance(value, (list, tuple)) else (
                list(value.values()) if isinstance(value, dict) else [value])
            for item in items:
                if getattr(item, "grad_fn", None) is not None and hasattr(item, "detach"):
                    memo[id(item)] = item.detach().clone()
    return copy.deepcopy(m, memo)
