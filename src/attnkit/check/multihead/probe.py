"""The probes of ``check_multi_head`` that need no copy of the module, and the reproducer
each finding prints (the others: :mod:`attnkit.check.multihead.gradients`).

A :class:`Harness` calls the module the way its ``forward`` wants (``m(x)`` or
``m(q, k, v, mask=...)``; batch-first unless ``m.batch_first`` is False; a mask as
``(B, Tq, Tk)``, ``(Tq, Tk)`` or ``(B, 1, Tq, Tk)``, whichever it takes; NumPy arrays for a
NumPy class) and watches every call for writes into its inputs. The probes work on
tensors; a NumPy module gets views of them (so a write into its input shows).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..catalogue import T as Tx
from ..catalogue import Text, join
from ..core.report import Finding, first_line
from ..core.repro import note, said
from ..core.where import failing_line
from ..meet.build import Built, safe_copy
from .gradients import dropout_knobs
from .held import held

__all__ = ["Harness"]

B, E, T = 2, 16, 5


def _rand(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class NoMaskLayout(Exception):
    """The module took none of the mask layouts the check knows."""


KEY_ONLY = ("bt", "b1t", "b11t")  # a mask per key, not per query: (B, Tk), (B, 1, Tk)...
SHAPES = {"tt": "(Tq, Tk)", "btt": "(B, Tq, Tk)", "b1tt": "(B, 1, Tq, Tk)",
          "bt": "(B, Tk)", "b1t": "(B, 1, Tk)", "b11t": "(B, 1, 1, Tk)"}


class Harness:
    """How the module under check is called (see the module docstring), and its probes.

    Attributes:
        built: how the module was built (:class:`attnkit.check.meet.build.Built`): fresh
            copies come from it, never from a deep copy of the module in use.
        self_only: ``forward`` takes one input (``m(x)``, ``m(x, mask=...)``).
        mask_name: the mask parameter, passed by keyword; None when there is none.
        input_names: q/k/v passed by these names, or None (by position); two names
            (``forward(x, memory, ...)``): the key is also the value (:attr:`kv_shared`).
        batch_first: inputs ``(B, T, E)``; False: ``(T, B, E)`` (the ``batch_first``
            attribute, else found by trying).
        convention: ``valid_lens``, ``masked``, ``keep``, ``additive`` or ``none``.
        layout: of the mask: ``tt``, ``btt``, ``b1tt`` or, per key, ``bt``, ``b1t``,
            ``b11t`` (:data:`SHAPES`); None until a mask was passed.
    """

    def __init__(self, built: Built, m: nn.Module, spec: str | None, name: str,
                 self_only: bool, mask_name: str | None,
                 input_names: tuple[str, ...] | None = None) -> None:
        self.built, self.m, self.spec, self.name = built, m, spec, name
        self.self_only, self.mask_name, self.input_names = self_only, mask_name, input_names
        # forward(query, memory): one tensor is both key and value, so no value of its own
        self.kv_shared = input_names is not None and len(input_names) == 2
        self.causal = False  # declared causal: built with its constructor's causal switch on
        self.batch_first = bool(getattr(m, "batch_first", True))
        self.numpy = not isinstance(m, nn.Module)
        self.mask_optional = True  # forward's mask has a default
        self.convention = "none"
        self.layout: str | None = None
        self.tried_layouts: list[Text] = []
        self.prefer_key_only = False  # a key padding mask by its name: (B, Tk) first
        self.behaves_causal: bool | None = None  # found by causality()
        self.mutation: Finding | None = None
        self.broken = False
        # torch's seed before every call, so that two calls compare with the same random
        # draws (a dropout the knobs cannot reach gives one finding, dropout-in-eval);
        # None where a probe sets the seeds itself.
        self.seed: int | None = 0
        self._knobs: list[str] | None = None
        self.flags: dict[str, bool] = {}  # set in every call: forward's causal flag, declared

    def fresh(self, seed: int = 0) -> Any:
        """A new module built as the checked one was (the same weights for the same
        ``seed``), in its constructor's train/dropout state: rebuilt, never a deep copy of
        a module that has run (its forward may have left non-leaf tensors on it)."""
        m = safe_copy(self.built.obj) if self.built.rebuild is None else self.built.rebuild(seed)
        if any(isinstance(p, nn.parameter.UninitializedParameter)
               for p in getattr(m, "parameters", list)()):
            # Lazy layers (nn.LazyLinear) get their shapes from a first call.
            seed_before, self.seed = self.seed, seed
            try:
                with torch.no_grad():
                    x = _rand(B, T, E)
                    self.call(m, x, None if self.self_only else x)
            except Exception:
                pass  # the calls that follow say what is wrong
            finally:
                self.seed = seed_before
                self.mutation = None
        return m

    @property
    def key_only(self) -> bool:
        """The mask says which keys each batch row may attend, not which per query: the
        probes mask keys (lengths) rather than queries."""
        return self.convention == "valid_lens" or self.layout in KEY_ONLY

    # -- calling --------------------------------------------------------------------------
    def _mask(self, keep: torch.Tensor | None, lens: torch.Tensor | None, layout: str,
              Bn: int, Tq: int, Tk: int, dtype: torch.dtype = torch.float32) -> dict:
        if self.convention == "none" or self.mask_name is None:
            return {}
        if keep is None and lens is None and not self.mask_optional:
            # A required mask, and nothing to mask: the mask that masks nothing.
            keep, lens = torch.ones(Tq, Tk, dtype=torch.bool), torch.full((Bn,), Tk)
        if self.convention == "valid_lens":
            return {} if lens is None else {self.mask_name: lens}
        if layout in KEY_ONLY:
            if lens is not None and lens.shape[0] == Bn:
                per_key = torch.arange(Tk)[None, :] < lens[:, None]
            elif keep is not None and keep.dim() == 3:  # one mask per example
                per_key = keep[:, -1]
            elif keep is not None:
                per_key = keep[-1].expand(Bn, Tk)  # the probes' masks are the same per query
            else:
                return {}
            m = {"bt": per_key, "b1t": per_key[:, None], "b11t": per_key[:, None, None]}[layout]
        elif keep is None:
            return {}
        else:
            per_example = keep.dim() == 3  # (B, Tq, Tk): a mask per example
            # (B, 1, Tq, Tk) has B examples: a (1, 1, Tq, Tk) mask also broadcasts into a
            # module that reads a (B, Tk) mask as mask[:, None, None, :], garbled but the
            # right size, so that try would be taken
            m = {"tt": keep, "btt": keep if per_example else keep.expand(Bn, *keep.shape),
                 "b1tt": keep[:, None] if per_example else keep.expand(Bn, 1, *keep.shape)
                 }[layout]
        if self.convention == "additive":  # in the inputs' dtype, as a model builds it
            fill = torch.finfo(dtype).min if dtype.is_floating_point else -1e30
            return {self.mask_name: torch.zeros(m.shape, dtype=dtype).masked_fill(~m, fill)}
        return {self.mask_name: (~m if self.convention == "masked" else m).clone()}

    def eval(self, m: Any) -> Any:
        """``m.eval()`` for a module (a NumPy class has no training mode)."""
        return m.eval() if hasattr(m, "eval") and callable(m.eval) else m

    def call(self, m: nn.Module, xq: torch.Tensor, xkv: torch.Tensor | None = None, *,
             keep: torch.Tensor | None = None, lens: torch.Tensor | None = None,
             xv: torch.Tensor | None = None) -> torch.Tensor:
        """The batch-first output of ``m`` on batch-first inputs (raises what ``m`` raises);
        ``xkv`` is the key and the value, unless ``xv`` gives the value."""
        Bn, Tq, Tk = xq.shape[0], xq.shape[1], (xq if xkv is None else xkv).shape[1]
        if self.layout is None and self.convention in ("masked", "keep", "additive") and (
                keep is not None or lens is not None or not self.mask_optional):
            self.layout = self._find_layout(m, xq, xkv, keep, lens)
        kw = self._mask(keep, lens, self.layout or "tt", Bn, Tq, Tk, xq.dtype)
        xk = xkv if xkv is not None else xq
        xs = [xq] if self.self_only else [xq, xk] if self.kv_shared else \
            [xq, xk, xv if xv is not None else xk]
        if not self.batch_first:
            xs = [x.transpose(0, 1) for x in xs]
        before = [x.detach().clone() for x in xs] + [v.clone() for v in kw.values()]
        if self.seed is not None:
            torch.manual_seed(self.seed)
        if self.numpy:  # views: a write into an array shows in the tensor
            arrays = [x.detach().numpy() for x in xs]
            named = {k: v.numpy() for k, v in kw.items()}
        else:
            arrays, named = list(xs), dict(kw)
        if self.input_names:
            named.update(zip(self.input_names, arrays))
            arrays = []
        out = unwrap_out(m(*arrays, **named, **self.flags))
        if self.numpy:
            out = torch.from_numpy(np.array(out))
        for i, (b, a) in enumerate(zip(before, xs + list(kw.values()))):
            if self.mutation is None and not torch.equal(b, a.detach()):
                what = (["query", "key", "value"] if not self.self_only else ["x"])[i] \
                    if i < len(xs) else self.mask_name
                self.mutation = Finding(
                    "mutates-input", Tx("mha.mutates", name=what),
                    Tx("measured.differs-after", name=what),
                    reproducer=self.repro([
                        "before = x.clone()", "run(x)" if self.self_only else "run(x, x, x)",
                        "assert torch.equal(x, before), " + said("repro.wrote-input")]))
        return out.transpose(0, 1) if not self.batch_first else out

    def find_batch_first(self) -> None:
        """Without a ``batch_first`` attribute, try: with inputs ``(4, 4, E)``, rows of the
        batch axis are independent (changing one changes no other's output)."""
        if hasattr(self.m, "batch_first"):
            return
        x = _rand(4, 4, E, seed=2)
        m = self.eval(self.m)

        def independent(axis: int) -> bool:
            for changed, watched in ((1, 0), (0, 1)):
                y = x.clone()
                y.select(axis, changed).add_(_rand(4, E, seed=3))
                xs, ys = ([x], [y]) if self.self_only else ([x, x, x], [y, y, y])
                if self.numpy:
                    xs, ys = [t.numpy() for t in xs], [t.numpy() for t in ys]
                if self.input_names:
                    a = m(**dict(zip(self.input_names, xs)))
                    b = m(**dict(zip(self.input_names, ys)))
                else:
                    a, b = m(*xs), m(*ys)
                a, b = torch.as_tensor(unwrap_out(a)), torch.as_tensor(unwrap_out(b))
                if not torch.allclose(a.select(axis, watched).float(),
                                      b.select(axis, watched).float(), atol=1e-5):
                    return False
            return True

        try:
            with torch.no_grad():
                if not independent(0) and independent(1):
                    self.batch_first = False
        except Exception:
            return  # the module needs a mask, or more: keep the default

    def _find_layout(self, m: nn.Module, xq: torch.Tensor, xkv: Any, keep: Any,
                     lens: Any = None) -> str:
        """The first mask layout ``m`` takes and answers with the right shape; raises
        :class:`NoMaskLayout` when none fits."""
        self.tried_layouts = []
        layouts = ("btt", "tt", "b1tt")
        # Without a batch_first attribute, a module that needs its mask cannot show its
        # layout without one (find_batch_first): (T, B, E) is tried too.
        orders = [self.batch_first] + ([not self.batch_first]
                                       if not hasattr(m, "batch_first") else [])
        for batch_first in orders:
            self.batch_first = batch_first
            for layout in (KEY_ONLY + layouts) if self.prefer_key_only else (layouts + KEY_ONLY):
                self.layout = layout
                try:
                    out = self.call(m, xq, xkv, keep=keep, lens=lens)
                except Exception as err:
                    where = failing_line(err)
                    label = SHAPES[layout] if batch_first else Tx("try.seq-first",
                                                                  layout=SHAPES[layout])
                    error = f"{type(err).__name__}: {first_line(err, 100)}"
                    self.tried_layouts.append(
                        Tx("try.raised-at", label=label, error=error, where=where) if where
                        else Tx("try.raised", label=label, error=error))
                    continue
                if tuple(out.shape) == (xq.shape[0], xq.shape[1], E):
                    return layout
                self.tried_layouts.append(Tx("try.output-shape-only", label=SHAPES[layout],
                                             shape=tuple(out.shape)))
        self.batch_first = orders[0]
        self.layout = None
        raise NoMaskLayout(join(self.tried_layouts))

    # -- reproducer text ------------------------------------------------------------------
    def repro(self, body: list, dtype: str | None = None, dropout: bool = False) -> Text:
        """A reproducer: build the module as the check did (eval mode, dropout 0 unless
        ``dropout``), make ``x`` and ``run()``, then ``body``."""
        if self.built.expr:
            load = self.built.load_lines
            build = self.built.expr
        else:
            load = [note(f"factory = {self.name}", "repro.factory-checked") if
                    self.name.isidentifier() else
                    note("factory = ...", "repro.factory-named", name=self.name)]
            build = f"factory({self.built.args or '16, 4'})"
        tr = "" if self.batch_first else ".transpose(0, 1)"
        lines: list = (["import numpy as np"] if self.numpy else []) + [
            "import torch", "from attnkit.check import load_target", "", *load,
            "torch.manual_seed(0)"] + (["np.random.seed(0)"] if self.numpy else []) + [
            f"m = {build}"]
        if not self.numpy and not dropout:
            if self._knobs is None:
                self._knobs = dropout_knobs(self.fresh(), 0.0)
            lines += ["m.eval()"] + [note(k, "repro.dropout-off") for k in self._knobs]
        if dtype:
            lines.append(f"m = m.to(torch.{dtype})")
        lines += [f"x = torch.randn({B}, {T}, {E}, generator=torch.Generator().manual_seed(0))"
                  + (f".to(torch.{dtype})" if dtype else ""), "",
                  "def run(*inputs, **mask):"]
        if not self.mask_optional and self.convention != "none" and self.mask_name:
            lines += [note("    if not mask:", "repro.mask-required"),
                      "        Tq, Tk = inputs[0].shape[1], inputs[-1].shape[1]",
                      f"        mask = {{{self.mask_name!r}: {self._nothing_masked_text()}}}"]
        lines += [note(f"    mask[{k!r}] = {v!r}", "repro.causal-flag")
                  for k, v in self.flags.items()]
        if self.numpy:
            lines += ["    out = m(*(t.numpy() for t in inputs), "
                      "**{k: v.numpy() for k, v in mask.items()})",
                      "    return torch.from_numpy(np.array(out[0] if isinstance(out, tuple) "
                      "else out))", ""]
        elif self.input_names:
            lines += [f"    out = m(**dict(zip({self.input_names!r}, "
                      f"(t{tr} for t in inputs))), **mask)",
                      f"    return (out[0] if isinstance(out, tuple) else out){tr}", ""]
        else:
            lines += [f"    out = m(*(t{tr} for t in inputs), **mask)" if tr else
                      "    out = m(*inputs, **mask)",
                      f"    return (out[0] if isinstance(out, tuple) else out){tr}", ""]
        return join(lines + body, "line")

    def _nothing_masked_text(self) -> str:
        if self.convention == "valid_lens":
            return f"torch.full(({B},), Tk)"
        shape = {"tt": "Tq, Tk", "btt": f"{B}, Tq, Tk", "b1tt": f"{B}, 1, Tq, Tk",
                 "bt": f"{B}, Tk", "b1t": f"{B}, 1, Tk", "b11t": f"{B}, 1, 1, Tk"}[
            self.layout or "tt"]
        if self.convention == "additive":
            return f"torch.zeros({shape}, dtype=inputs[0].dtype)"
        fill = "zeros" if self.convention == "masked" else "ones"
        return f"torch.{fill}({shape}, dtype=torch.bool)"

    def mask_text(self, keep_lines: list, lens: str | None = None) -> tuple[list, str]:
        """Lines making the mask the module takes, and the keyword text that passes it."""
        if self.convention == "valid_lens":
            return [f"valid_lens = torch.tensor({lens})"], f"{self.mask_name}=valid_lens"
        if self.layout in KEY_ONLY and lens is None:
            keep_lines = keep_lines + [note(f"keep = keep[-1].expand({B}, -1)", "repro.per-key")]
            shaped = {"bt": "keep", "b1t": "keep[:, None]", "b11t": "keep[:, None, None]"}[
                self.layout]
        elif self.layout in KEY_ONLY:
            keep_lines = [note(f"keep = torch.arange({T})[None, :] < torch.tensor({lens})[:, None]",
                               "repro.lens", lens=lens)]
            shaped = {"bt": "keep", "b1t": "keep[:, None]", "b11t": "keep[:, None, None]"}[
                self.layout]
        else:
            shaped = {"tt": "keep", "btt": f"keep.expand({B}, -1, -1)",
                      "b1tt": f"keep.expand({B}, 1, -1, -1)"}[self.layout or "tt"]
        if self.convention == "additive":
            return keep_lines + [note(
                f"mask = torch.zeros({shaped}.shape, dtype=x.dtype).masked_fill(~{shaped}, "
                f"torch.finfo(x.dtype).min)", "repro.additive")], f"{self.mask_name}=mask"
        masked = self.convention == "masked"
        return keep_lines + [note(f"mask = {'~' + shaped if masked else shaped}",
                                  "repro.masked" if masked else "repro.may-attend")], \
            f"{self.mask_name}=mask"

    def call_words(self) -> Text:
        """How the module is called, in words (for the report)."""
        inputs = ("x" if self.self_only else ", ".join(
            f"{n}=" for n in self.input_names) if self.input_names else "query, key, value")
        mask = (f", {self.mask_name}=..." if self.mask_name and self.convention != "none"
                else "")
        return Tx("mha.call-words", call=f"m({inputs}{mask})",
                  layout="(B, T, E)" if self.batch_first else "(T, B, E)")

    def args_text(self, x: str, kv: str | None = None) -> str:
        return x if self.self_only else f"{x}, {kv or x}, {kv or x}"

    # -- probes ---------------------------------------------------------------------------
    def unregistered(self) -> list[Finding]:
        registered = {id(p) for p in self.m.parameters()}
        missing: list[str] = []
        holders: list[str] = []
        for mod_path, mod in self.m.named_modules():
            for attr, value in vars(mod).items():
                if attr.startswith("_"):
                    continue
                base = f"{mod_path}.{attr}" if mod_path else attr
                for path, obj in held(value, base, depth=0):
                    # A tensor a forward produced (self.attn = p_attn) is not a parameter:
                    # only graph leaves that train count.
                    tensors = (list(obj.named_parameters()) if isinstance(obj, nn.Module)
                               else [("", obj)] if isinstance(obj, torch.Tensor)
                               and obj.requires_grad and obj.is_leaf else [])
                    for sub, p in tensors:
                        if id(p) not in registered:
                            missing.append(f"{path}.{sub}" if sub else path)
                            if base not in holders:
                                holders.append(base)
        if not missing:
            return []
        first = missing[0]
        return [Finding(
            "unregistered-parameter",
            Tx("mha.unregistered", holder=f"self.{holders[0]}", n=len(missing), first=first),
            Tx("measured.unregistered", n=len(missing), names=", ".join(missing[:6])
               + (" ..." if len(missing) > 6 else "")),
            reproducer=self.repro([
                "registered = {id(p) for p in m.parameters()}",
                f"p = m.{first}",
                "assert id(p) in registered, " + said("repro.not-registered", name=first)]))]

    def shapes(self) -> list[Finding]:
        found = []
        sizes = [(T, T)] if self.self_only else [(T, T), (3, 7), (7, 3)]
        for Tq, Tk in sizes:
            xq, xkv = _rand(B, Tq, E), _rand(B, Tk, E, seed=1)
            try:
                out = self.call(self.eval(self.m), xq, xkv)
            except Exception as err:
                self.broken = Tq == Tk
                first = f"{type(err).__name__}: {first_line(err, 150)}"
                msg = Tx("mha.raises-on", query=(B, Tq, E), kv=(B, Tk, E), error=first)
                if Tq != Tk and found == [] and (T, T) in sizes:  # equal lengths ran
                    msg = Tx("mha.raises-on-lengths", query=(B, Tq, E), kv=(B, Tk, E),
                             error=first.rstrip(".") + ".")
                code = "shape"
                if self.broken:  # not even the plainest call: the check could not call it
                    code, msg = "call-failed", Tx("mha.not-callable-as",
                                                  call=self.call_words(), error=first)
                found.append(Finding(code, msg, Tx("measured.raised", name=type(err).__name__),
                                     reproducer=self.repro([
                    f"kv = torch.randn({B}, {Tk}, {E})" if Tk != T or Tq != T else "kv = x",
                    f"q = torch.randn({B}, {Tq}, {E})" if Tq != T else "q = x",
                    f"out = run({self.args_text('q', 'kv')})"])))
                break
            if tuple(out.shape) != (B, Tq, E):
                self.broken = Tq == Tk
                found.append(Finding("shape", Tx("mha.output-shape", shape=tuple(out.shape),
                                                 want=(B, Tq, E), Tq=Tq, Tk=Tk),
                                     reproducer=self.repro([
                                         f"q, kv = torch.randn({B}, {Tq}, {E}), "
                                         f"torch.randn({B}, {Tk}, {E})",
                                         f"out = run({self.args_text('q', 'kv')})",
                                         f"assert out.shape == ({B}, {Tq}, {E}), out.shape"])))
                break
        return found + ([self.mutation] if self.mutation else [])

    def large_logits(self) -> list[Finding]:
        x = _rand(B, T, E)
        for c in (30.0, 100.0):
            out = self.call(self.eval(self.m), c * x)
            if not torch.isfinite(out).all():
                return [Finding(
                    "nan-or-inf", Tx("mha.no-max-trick"),
                    Tx("measured.non-finite-at", n=int((~torch.isfinite(out)).sum()),
                       size=out.numel(), scale=f"{c:g}"),
                    reproducer=self.repro([f"out = run({self.args_text(f'{c:g} * x')})",
                                           "print(out[0, 0])",
                                           "assert torch.isfinite(out).all(), "
                                           + said("repro.nan-from-finite")]))]
        return []

def unwrap_out(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, (tuple, list)) else result
