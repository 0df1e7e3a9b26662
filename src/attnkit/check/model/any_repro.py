"""The reproducer of a finding of ``check_model`` on any PyTorch model: the call's inputs
saved to a ``.pt`` file (tensors and plain values only, so ``torch.load(...,
weights_only=True)`` reads it back and runs no code), and a few printed lines that call the
same function (torch's SDPA, or the implementation under test loaded from its file) or
rebuild the same ``nn.MultiheadAttention`` from its weights, compute the float64 oracle,
and fail while the bug is there."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from ..catalogue import T, Text, join
from ..meet.targets import target_spec
from .torch_calls import SDPA_PARAMETERS

__all__ = ["any_reproducer", "file_spec"]


def file_spec(obj: Any) -> str | None:
    """``"/abs/path/file.py:name"`` for a function or class defined at the top of a file
    outside installed packages (a reproducer then finds it from any folder), else None."""
    qualname = getattr(obj, "__qualname__", "")
    module = sys.modules.get(getattr(obj, "__module__", "") or "")
    path = getattr(module, "__file__", None)
    if not qualname or "<" in qualname or not path or "site-packages" in path:
        return None
    return f"{os.path.abspath(path)}:{qualname}"


def _function_lines(fn: Any) -> list[str | Text]:
    """Lines that bind ``fn`` to what ran: torch's SDPA, or the implementation under test
    loaded again from the file that defines it (the custom function registered inside the
    reproducer)."""
    import torch.nn.functional as F

    if fn is F.scaled_dot_product_attention:
        return ["fn = torch.nn.functional.scaled_dot_product_attention"]
    spec = file_spec(fn) or target_spec(fn)
    if spec is None:
        name = getattr(fn, "__qualname__", type(fn).__name__)
        return ["fn = ...  # " + T("repro.define-here", name=name)]
    return ["from attnkit.check import load_target",
            f"fn = load_target({spec!r})  # " + T("repro.under-test")]


def _save(folder: Path, f: Any, data: dict) -> Path:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    stem = re.sub(r"[^A-Za-z0-9]+", "-", f"{f.layer or 'model'}-{f.code}")
    path = folder / f"{stem.strip('-')}.pt"
    torch.save(data, path)
    return path


def _sdpa(folder: Path, f: Any, call: Any, judged: Any, bound: str) -> tuple[Path, Text]:
    import torch

    a = call.arguments
    from .any_judge import _four

    args = [a[n] for n in SDPA_PARAMETERS[:call.positional]]
    kwargs = {n: a[n] for n in call.keywords}
    data: dict[str, Any] = {"args": [x.cpu() if isinstance(x, torch.Tensor) else x
                                     for x in args],
                            "kwargs": {n: x.cpu() if isinstance(x, torch.Tensor) else x
                                       for n, x in kwargs.items()}}
    if judged.keep is not None:
        data.update(q=_four(a["query"].cpu()), k=_four(a["key"].cpu()),
                    v=_four(a["value"].cpu()), keep=torch.as_tensor(judged.keep.copy()),
                    bias=judged.bias, scale=judged.scale)
    path = _save(folder, f, data)
    lines: list[str | Text] = ["import torch"]
    if judged.keep is not None:
        lines.append("from attnkit.testing import reference_attention")
    lines += [f"d = torch.load({str(path)!r}, weights_only=True)"] + _function_lines(
        call.function)
    if call.error is not None:  # the call raised: calling it again raises the same
        lines.append("fn(*d['args'], **d['kwargs'])  # " + T("repro.raises", error=f.measured))
        return path, join(lines, "line")
    if judged.keep is None:  # a wrong shape
        want = tuple(a["query"].shape[:-1]) + (a["value"].shape[-1],)
        lines += ["out = fn(*d['args'], **d['kwargs'])",
                  "print('" + T("repro.output-shape") + "', tuple(out.shape))",
                  f"assert tuple(out.shape) == {want}, 'shape'"]
        return path, join(lines, "line")
    b, h, i = f.batch or 0, f.head or 0, f.query or 0
    lines += ["out = fn(*d['args'], **d['kwargs'])",
              "got = out.double().reshape(*d['keep'].shape[:-1], -1)  # (B, H, Tq, Dv)",
              "want = reference_attention(d['q'], d['k'], d['v'], mask=d['keep'], "
              "bias=d['bias'], scale=d['scale']).out  # " + T("repro.oracle-received"),
              f"b, h, i = {b}, {h}, {i}",
              "err = abs(got[b, h, i].numpy() - want[b, h, i]).max()",
              "print('" + T("repro.row-error") + "', err)",
              f"assert err <= {bound}, {f.code!r}"]
    return path, join(lines, "line")


_MHA_INIT = ("embed_dim", "num_heads", "bias", "add_bias_kv", "add_zero_attn", "kdim", "vdim",
             "batch_first")


def _mha(folder: Path, f: Any, call: Any, judged: Any, bound: str) -> tuple[Path, Text]:
    import torch

    m, a = call.module, call.arguments
    init = {"embed_dim": m.embed_dim, "num_heads": m.num_heads,
            "bias": m.in_proj_bias is not None, "add_bias_kv": m.bias_k is not None,
            "add_zero_attn": m.add_zero_attn, "kdim": m.kdim, "vdim": m.vdim,
            "batch_first": m.batch_first}
    cls = type(m)
    kwargs = {n: (x.cpu() if isinstance(x, torch.Tensor) else x) for n, x in a.items()
              if n not in ("query", "key", "value") and n != "need_weights"}
    attrs = {n: x for n, x in vars(m).items() if not n.startswith("_") and n != "training"
             and isinstance(x, (bool, int, float, str, type(None)))}
    state = {n: t.detach().cpu() for n, t in m.state_dict().items()}
    data = {"init": init, "attrs": attrs, "state": state,
            "dtype": str(a["query"].dtype).replace("torch.", ""),
            "query": a["query"].cpu(), "key": a["key"].cpu(), "value": a["value"].cpu(),
            "kwargs": kwargs}
    path = _save(folder, f, data)
    spec = "torch.nn:MultiheadAttention" if cls is torch.nn.MultiheadAttention else \
        file_spec(cls) or target_spec(cls)
    lines: list[str | Text] = ["import torch"] + (["from attnkit.check import load_target"]
                                if cls is not torch.nn.MultiheadAttention else []) + [
             "from attnkit.check.model.any_mha import mha_reference",
             f"d = torch.load({str(path)!r}, weights_only=True)"]
    if spec is None:
        lines.append("m = ...  # " + T("repro.build-yours", name=cls.__name__))
    elif cls is torch.nn.MultiheadAttention:
        lines.append("m = torch.nn.MultiheadAttention(**d['init'])")
    else:  # the class's own forward on nn.MultiheadAttention's structure
        lines += [f"cls = load_target({spec!r})",
                  "m = cls.__new__(cls)",
                  "torch.nn.MultiheadAttention.__init__(m, **d['init'])"]
    lines += ["for name, x in d['attrs'].items():  # " + T("repro.own-settings"),
              "    setattr(m, name, x)",
              "m.load_state_dict(d['state'])",
              "m = m.to(getattr(torch, d['dtype'])).eval()"]
    call_line = "out = m(d['query'], d['key'], d['value'], **d['kwargs'])[0]"
    if call.error is not None:
        lines.append("with torch.no_grad():")
        lines.append(f"    {call_line}  # " + T("repro.raises", error=f.measured))
        return path, join(lines, "line")
    lines += ["with torch.no_grad():", f"    {call_line}",
              "got = out.double()" + ("" if m.batch_first or a["query"].ndim == 2
                                      else ".transpose(0, 1)") +
              ("[None]" if a["query"].ndim == 2 else "") + "  # (N, L, E)",
              "want, _ = mha_reference(m, d['query'], d['key'], d['value'], "
              "**d['kwargs'])  # " + T("repro.from-weights"),
              f"b, i = {f.batch or 0}, {f.query or 0}",
              "err = abs(got[b, i].numpy() - want[b, i]).max()",
              "print('" + T("repro.row-error") + "', err)",
              f"assert err <= {bound}, {f.code!r}"]
    return path, join(lines, "line")


def any_reproducer(folder: Path, f: Any, call: Any, judged: Any) -> tuple[Path, Text]:
    """Save the inputs of the call behind finding ``f`` to a ``.pt`` file in ``folder``
    and return ``(path, lines)``: Python that runs as printed and fails while the bug is
    there (a :class:`Text`: the same code in every language, its comments and printed
    words in the report's).

    Args:
        folder: where the ``.pt`` file goes (made when missing).
        f: the :class:`~.report.ModelFinding`.
        call: the :class:`~.torch_calls.AttentionCall` it was found on.
        judged: the :class:`~.any_judge.Judged` of that call.
    """
    bound = f"{judged.bound:.6g}" if judged.bound else "1e-5"
    if call.kind == "flex":  # score_mod and mask_mod are code: only the tensors are saved
        q, k, v = call.arguments["args"][:3]
        path = _save(folder, f, {"q": q.cpu(), "k": k.cpu(), "v": v.cpu()})
        return path, join([
            "import torch",
            "from torch.nn.attention.flex_attention import flex_attention",
            f"d = torch.load({str(path)!r}, weights_only=True)",
            "# " + T("repro.flex-code", layer=f.layer),
            "# out = flex_attention(d['q'], d['k'], d['v'], score_mod=..., block_mask=...)",
            "# " + T("repro.flex-off", batch=f.batch, head=f.head, query=f.query,
                     bound=bound)], "line")
    if call.kind == "mha":
        return _mha(folder, f, call, judged, bound)
    return _sdpa(folder, f, call, judged, bound)
