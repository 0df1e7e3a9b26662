"""The reproducer of a ``check_model`` finding: the call's inputs saved to a ``.pt`` file
(tensors and plain values only, so ``torch.load(..., weights_only=True)`` reads it back and
runs no code), and a few printed lines that recompute the implementation and the float64
oracle from it and fail while the bug is there."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ..catalogue import T, Text, join
from ..meet.targets import target_spec
from .any_repro import file_spec
from .masks import received_keep

__all__ = ["model_reproducer"]

# The keyword arguments an attention function gets that the reproducer passes again.
_KWARGS_SAVED = ("softcap", "s_aux", "sliding_window", "position_bias", "is_causal")


def model_reproducer(folder: Path, impl: str, f: Any, call: tuple,
                     measured: str) -> tuple[Path, Text]:
    """Save the inputs of the call behind finding ``f`` of implementation ``impl`` to a
    ``.pt`` file in ``folder`` and return ``(path, lines)``: Python that loads the file
    with ``torch.load(..., weights_only=True)``, calls the implementation again and the
    float64 oracle, and fails while the bug is there. The lines are a :class:`Text`: the
    code is the same in every language, its comments and printed words are the report's.

    ``call`` is ``(q, k, v), mask, kwargs, keep, expected, place, fn, module`` as the
    check recorded it (``keep`` None for a call that raised). A ``mask-mismatch`` that
    names a query and a key (``f.key`` set: the mask the call received differs from the
    expected one at that pair) shows the pair of masks (:func:`_mask_lines`); any other
    finding (a sliding window the function ignores: the mask was right, the output is not)
    calls the implementation again against the oracle.
    """
    keep4, fn, module = call[3], call[6], call[7]
    path, data = _save_call(folder, impl, f, call)
    load_fn = _load_fn(impl, fn, module)
    if f.code == "mask-mismatch" and f.key is not None:
        return path, _mask_lines(path, f, data)
    lines = ["import torch",
             "from transformers import AttentionInterface",
             "from attnkit.testing import reference_attention"]
    if impl == "attnkit":
        lines.append("from attnkit.integrations.transformers import register; register()")
    lines += [f"d = torch.load({str(path)!r}, weights_only=True)", load_fn,
              "module = torch.nn.Module().eval()  # " + T("repro.stand-in"),
              "module.is_causal, module.layer_idx = d['is_causal'], d['layer_idx']",
              "module.num_key_value_groups = d['num_key_value_groups']",
              "for name, x in d['module'].items():  # " + T("repro.module-state"),
              "    setattr(module, name, x)"]
    if keep4 is None:  # the call raised: calling it again raises the same
        why = T("repro.raises-half") if f.code == "float16-overflow" else \
            T("repro.raises", error=f.measured)
        lines += ["fn(module, d['q'], d['k'], d['v'], d.get('attention_mask'), "
                  "scaling=d['scaling'], **d['kwargs'])  # " + why]
        return path, join(lines, "line")
    lines += ["out, _ = fn(module, d['q'], d['k'], d['v'], d.get('attention_mask'), "
              "scaling=d['scaling'], dropout=0.0, **d['kwargs'])",
              "got = out.transpose(1, 2).double()  # (B, H, Tq, Dv)"]
    lines += ["kw = d['kwargs']",
              "want = reference_attention(d['q'], d['k'], d['v'], mask=d['keep'], "
              "bias=d.get('bias'), scale=d['scaling'], softcap=kw.get('softcap'),"
              " sinks=kw.get('s_aux')).out  # " + T("repro.oracle-received"),
              f"b, h, i = {f.batch}, {f.head}, {f.query}",
              "err = abs(got[b, h, i].numpy() - want[b, h, i]).max()",
              "print('" + T("repro.row-error") + "', err)",
              f"assert err <= {_bound_text(measured)}, {f.code!r}"]
    return path, join(lines, "line")


def _save_call(folder: Path, impl: str, f: Any, call: tuple) -> tuple[Path, dict[str, Any]]:
    """Save what the call behind ``f`` received (q, k, v, its mask, keyword arguments, the
    module's settings, the mask the oracle used) to ``folder``: ``(path, what was saved)``."""
    import torch

    snap, mask, kwargs, keep4, want, _place, _fn, module = call
    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", f"{impl}-step{f.step}-{f.layer}").strip("-")
    path = folder / f"{stem}.pt"
    q, k, v = snap
    data: dict[str, Any] = {"q": q.cpu(), "k": k.cpu(), "v": v.cpu()}
    if isinstance(mask, torch.Tensor):
        received, _, _ = received_keep(mask, module, kwargs, q, k)
        data["attention_mask"] = (received if type(mask).__name__ == "StructuredMask"
                                  else mask.detach().cpu().clone())
    data["kwargs"] = {n: (kwargs[n].detach().cpu() if isinstance(kwargs[n], torch.Tensor)
                          else kwargs[n]) for n in _KWARGS_SAVED if n in kwargs}
    data["scaling"] = kwargs.get("scaling")
    data["is_causal"] = bool(getattr(module, "is_causal", True))
    data["layer_idx"] = getattr(module, "layer_idx", None)
    data["num_key_value_groups"] = q.shape[1] // k.shape[1]
    data["module"] = module_state(module)
    _, bias, _ = received_keep(mask, module, kwargs, q, k)
    if bias is not None:
        data["bias"] = bias.detach().cpu()
    if keep4 is not None:
        data["keep"] = keep4[:, :1] if bool((keep4 == keep4[:, :1]).all()) else keep4
        data["expected"] = want[:, None]
    torch.save(data, path)
    return path, data


def _load_fn(impl: str, fn: Any, module: Any) -> str | Text:
    """The line(s) that bind ``fn`` to the implementation in a reproducer."""
    if impl == "eager":
        mod = type(module).__module__
        return f"from {mod} import eager_attention_forward as fn"
    if impl in ("sdpa", "attnkit") or _ships_with(fn):
        return f"fn = AttentionInterface()[{impl!r}]"
    # the user's own function: registered inside the reproducer, from its file
    spec = file_spec(fn) or target_spec(fn)
    return (f"fn = AttentionInterface()[{impl!r}]  # " + T("repro.register-first")
            if spec is None else
            f"from attnkit.check import load_target\n"
            f"fn = load_target({spec!r})\n"
            f"AttentionInterface.register({impl!r}, fn)  # " + T("repro.as-ran"))


def _mask_lines(path: Path, f: Any, data: dict[str, Any]) -> Text:
    """A ``mask-mismatch`` reproducer: the mask the call received against the one config
    and padding call for, at the pair the finding names."""
    h = 0 if data["keep"].shape[1] == 1 else f.head
    where = T("repro.pair", batch=f.batch) if f.head is None else \
        T("repro.pair-head", batch=f.batch, head=f.head)
    return join([
        "import torch",
        f"d = torch.load({str(path)!r}, weights_only=True)",
        f"b, h, i, j = {f.batch}, {h}, {f.query}, {f.key}  # " + where,
        "received = bool(d['keep'][b, h, i, j])  # " + T("repro.received-allows"),
        "expected = bool(d['expected'][b, 0, i, j])  # " + T("repro.expected-allows"),
        "print('" + T("repro.may-see") + "', received, '" + T("repro.expected")
        + "', expected)",
        "assert received == expected, " + T("repro.quoted", text=f.message)], "line")


def module_state(module: Any) -> dict[str, Any]:
    """What an attention function may read off the calling module, in a form
    ``torch.load(weights_only=True)`` reads back: its plain settings (numbers, strings,
    bools, None; ``scaling``, ``sliding_window``, ...) and its own parameters and buffers
    (``sinks``), not its submodules'."""
    import torch

    state: dict[str, Any] = {}
    for name, x in vars(module).items():
        if not name.startswith("_") and name != "training" and \
                isinstance(x, (bool, int, float, str, type(None))):
            state[name] = x
    if isinstance(module, torch.nn.Module):
        for name, t in list(module._parameters.items()) + list(module._buffers.items()):
            if t is not None:
                state[name] = t.detach().cpu().clone()
    return state


def _ships_with(fn: Any) -> bool:
    """A function of transformers or attnkit (``flash_attention_2``, ``flex_attention``):
    the reproducer gets it from ``AttentionInterface`` like the model did."""
    mod = getattr(fn, "__module__", "") or ""
    return mod.startswith(("transformers.", "attnkit."))


def _bound_text(measured: str) -> str:
    m = re.search(r"= ([0-9.e+-]+)\s*$", measured)
    return m.group(1) if m else "1e-5"
