"""Meeting the module ``check_multi_head`` judges: building it, reading how ``forward`` is
called, finding its mask convention and layout, writing the report's header, and the
``call-failed`` findings of a module that cannot be built or called (the spine's
**prepare**, :class:`attnkit.check.multihead.check.MultiHeadCheck`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from ..catalogue import T as Tx
from ..catalogue import Text, UsageError, join
from ..core.judge import first_line
from ..core.report import Finding, Report
from ..core.repro import note
from ..core.where import failing_line
from ..meet.adapt import LENS_NAMES, QKV_NAMES, Call, origin_of, read_call
from ..meet.build import BuildError, BuildRaised, build_module

__all__ = ["build_target", "failed_call", "find_convention", "no_layout_finding",
           "raised_building", "read_signature", "write_header"]


def read_signature(m: Any) -> tuple[bool, Call]:
    """``(self_attention_only, how forward is called)``: ``m(x[, mask=...])`` when forward
    takes one required input besides its mask and flags, else ``m(query, key, value, ...)``
    (by name when the names say which is which)."""
    fn = m.forward if hasattr(m, "forward") else m
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False, Call(guessed=None)
    qkv = read_call(m, 3)
    if qkv.input_names or _names_qkv(params):
        # forward(query, key=None, value=None): self-attention by default, cross-attention
        # when key and value are given; called with all three, key is never a mask
        return False, qkv
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    inputs = positional or [p for p in params if p.kind == p.KEYWORD_ONLY]
    required = [p for p in inputs if p.default is inspect.Parameter.empty
                and "mask" not in p.name.lower() and p.name.lower() not in LENS_NAMES]
    self_only = len(required) == 1 or len(inputs) == 1
    if not self_only and len(required) == 2 and inputs[:2] == required \
            and _names_memory(required[1].name):
        # forward(x, memory, memory_mask=None): the query and one tensor that is both key
        # and value (an encoder-decoder's cross-attention); read as m(query, key, value),
        # its mask would be passed as the value. Only a name that says so: forward(src,
        # pos) is self-attention with a position embedding, not a memory
        two = read_call(m, 2)
        if two.input_names is None and not two.unfilled:
            two.input_names = tuple(p.name for p in required)
        return False, two
    if not self_only:
        return False, qkv
    return True, read_call(m, 1)


MEMORY_WORDS = ("mem", "context", "ctx", "enc", "kv", "cond", "source", "src", "xa")


def _names_memory(name: str) -> bool:
    """``name`` says the tensor the keys and values come from: ``memory``, ``context``,
    ``encoder_hidden_states``, ``kv``, ``cond``, ``xa`` (not a position: ``pos``)."""
    name = name.lower()
    return name in ("y", "other") or any(w in name for w in MEMORY_WORDS) and "pos" not in name


def _names_qkv(params: list[inspect.Parameter]) -> bool:
    """The first three parameters are named as query, key and value (any of their
    spellings), the last two perhaps with a default."""
    names = tuple(p.name.lower() for p in params[:3])
    return any(names == triple for triple in QKV_NAMES)


def build_target(factory: Any, report: Report, spec: str | None, causal: bool = False) -> Any:
    """The module built from ``factory`` (None, with the finding, when it cannot be);
    ``causal``: declared causal, a constructor's causal switch is set."""
    from .probe import E  # torch: imported here

    origin = origin_of(factory)
    report.origin = origin
    try:
        built = build_module(factory, E, 4, spec, causal=causal)
    except BuildError as err:
        report.add(Finding("call-failed", err.text, Tx("measured.not-built")))
        return None
    except BuildRaised as raised:
        report.add(raised_building(raised, spec))
        return None
    except (Exception, SystemExit) as err:
        tried = _tried(factory)
        report.add(failed_call(err, Tx("mha.building", tried=tried), Tx("mha.fix-factory")))
        return None
    report.origin = join([x for x in (origin, built.how) if x])
    if not callable(built.obj):
        report.add(Finding("call-failed", Tx("mha.gives-not-callable", how=built.how,
                                            type=type(built.obj).__name__),
                           Tx("measured.not-callable")))
        return None
    return built


def find_convention(h: Any, call: Any, convention: str) -> tuple[str, str, Finding | None]:
    """The mask convention (declared, read off the signature or found by behaviour), how it
    was chosen, and the finding when no mask layout fits the module."""
    import torch

    from .masks import mask_polarity
    from .probe import NoMaskLayout

    mask_name = call.mask_name
    conv, how = convention, "declared"
    no_layout: Finding | None = None
    if convention == "auto":
        if mask_name is None:
            conv, how = "none", "from the signature"
        elif call.guessed in ("valid_lens", "masked"):
            conv, how = call.guessed, "from the signature"
        else:
            try:
                found = mask_polarity(h)
            except NoMaskLayout as err:
                found, no_layout = None, no_layout_finding(h, err.args[0])
            conv, how = (found, "from behaviour") if found else ("keep", "assumed")
    elif conv != "none" and mask_name is None:
        raise UsageError(Tx("mha.no-mask-to-declare", conv=conv))
    h.convention = conv
    if no_layout is None and conv in ("masked", "keep", "additive") and h.layout is None:
        try:
            keep = torch.ones(5, 5, dtype=torch.bool)
            keep[:, 3:] = False
            h.call(h.eval(h.m), torch.randn(2, 5, 16), keep=keep)
        except NoMaskLayout as err:
            no_layout = no_layout_finding(h, err.args[0])
        except Exception:
            pass  # the first call says what the module raises
    if no_layout is not None:
        h.convention = conv = "none"  # the mask probes cannot run
        if convention == "auto" and _by_place_only(call):
            # an optional input taken for the mask by its place alone (forward(x,
            # context=None)) that takes no mask is no mask, not a call that failed
            how, no_layout = "no-layout", None
    return conv, how, no_layout


def _by_place_only(call: Call) -> bool:
    """The mask parameter was read off its place right after the inputs, not its name (no
    "mask", no length), and forward runs without it."""
    name = (call.mask_name or "").lower()
    return call.mask_default and call.guessed is None and "mask" not in name \
        and name not in LENS_NAMES


def write_header(report: Report, h: Any, m: Any, call: Any, conv: str, how: str,
            no_layout: Finding | None) -> None:
    """The report's convention and layout lines."""
    from .probe import SHAPES

    mask_name = call.mask_name
    how_text = (Tx("how.no-layout", name=mask_name) if no_layout is not None or how == "no-layout"
                else Tx(f"how.{how}"))
    report.convention = Tx("header.convention", name=conv, how=how_text)
    if conv != "none" and mask_name:
        report.convention += Tx("header.passed-as", name=mask_name)
    if h.layout:
        report.convention += f" {SHAPES[h.layout]}"
    report.layout = "(B, T, E)" if h.batch_first else "(T, B, E)"
    if h.self_only:
        report.layout += Tx("header.self-attention")
    if call.input_names:
        report.layout += Tx("header.by-name", names="=, ".join(call.input_names) + "=")
    if not hasattr(m, "batch_first") and not h.batch_first:
        report.layout += Tx("header.found-by-trying")


def no_layout_finding(h: Any, tried: Text) -> Finding:
    """``call-failed`` for a mask no layout fits: the first try and the line it failed on,
    the factory to write, and a reproducer that makes the first try again."""
    from .probe import B, T  # torch: imported here

    items = tried.fields.get("items") if isinstance(tried, Text) else None
    first = items[0] if items else tried
    expr = re.sub(r"=4\b", "=H", re.sub(r"=16\b", "=E", h.built.expr or f"{h.name}(E, H)"))
    inputs = "x" if h.self_only else "query, key, value"
    factory = note(f"class Checked(torch.nn.Module): def __init__(self, E, H): "
                   f"super().__init__(); self.inner = {expr}; def forward(self, {inputs}, "
                   f"mask=None): return self.inner({inputs}, {h.mask_name}=...)",
                   "repro.make-mask")
    key_only = h.prefer_key_only or h.convention == "valid_lens"
    shape = f"{B}, {T}" if key_only else f"{B}, {T}, {T}"
    fill = "zeros" if h.convention == "masked" else "ones"
    mask = (f"torch.full(({B},), {T})" if h.convention == "valid_lens"
            else note(f"torch.{fill}({shape}, dtype=torch.bool)", "repro.nothing-masked"))
    return Finding("call-failed", Tx("mha.no-mask-layout", name=h.mask_name, first=first,
                                     factory=factory),
                   Tx("measured.tried-layouts", tries=tried),
                   reproducer=h.repro(["mask = " + mask,
                                       f"out = run({h.args_text('x')}, {h.mask_name}=mask)"]))


def failed_call(err: BaseException, what: Text, fix: Text) -> Finding:
    where = failing_line(err)  # the line of the user's code that raised
    error = f"{type(err).__name__}: {first_line(err)}"
    return Finding("call-failed", Tx("mha.raised-at", what=what, error=error, where=where,
                                     fix=fix) if where else
                   Tx("mha.raised", what=what, error=error, fix=fix),
                   Tx("measured.raised", name=type(err).__name__))


def raised_building(raised: BuildRaised, spec: str | None) -> Finding:
    """``call-failed`` for a constructor that raised: the call, the line that failed, the
    factory to write, and a reproducer that makes the same call."""
    err = raised.error
    where = failing_line(err)
    file = (spec or "my_file.py:x").rsplit(":", 1)[0]
    error = f"{type(err).__name__}: {first_line(err)}"
    fix = Tx("mha.fix-factory-written", factory=raised.factory, file=file)
    what = Tx("mha.building-as", expr=raised.expr)
    return Finding(
        "call-failed", Tx("mha.raised-at", what=what, error=error, where=where, fix=fix)
        if where else Tx("mha.raised", what=what, error=error, fix=fix),
        Tx("measured.raised", name=type(err).__name__),
        reproducer=join(["from attnkit.check import load_target", *raised.loads,
                         note(f"m = {raised.expr}", "repro.raises-name",
                              error=type(err).__name__)], "line"))


def _tried(factory: Any) -> str:
    try:
        return f" {getattr(factory, '__name__', 'factory')}{inspect.signature(factory)}"
    except (TypeError, ValueError):
        return ""
