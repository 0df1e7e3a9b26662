"""The probes of ``check_multi_head`` that need no copy of the module, and the reproducer
each finding prints (the others: :mod:`attnkit.check.mhagrads`).

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

from .build import Built, safe_copy
from .mhagrads import dropout_knobs
from .report import Finding

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
        built: how the module was built (:class:`attnkit.check.build.Built`): fresh
            copies come from it, never from a deep copy of the module in use.
        self_only: ``forward`` takes one input (``m(x)``, ``m(x, mask=...)``).
        mask_name: the mask parameter, passed by keyword; None when there is none.
        input_names: q/k/v passed by these names, or None (by position).
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
        self.batch_first = bool(getattr(m, "batch_first", True))
        self.numpy = not isinstance(m, nn.Module)
        self.mask_optional = True  # forward's mask has a default
        self.convention = "none"
        self.layout: str | None = None
        self.tried_layouts: list[str] = []
        self.prefer_key_only = False  # a key padding mask by its name: (B, Tk) first
        self.behaves_causal: bool | None = None  # found by causality()
        self.mutation: Finding | None = None
        self.broken = False
        # torch's seed before every call, so that two calls compare with the same random
        # draws (a dropout the knobs cannot reach gives one finding, dropout-in-eval);
        # None where a probe sets the seeds itself.
        self.seed: int | None = 0
        self._knobs: list[str] | None = None

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
            elif keep is not None:
                per_key = keep[-1].expand(Bn, Tk)  # the probes' masks are the same per query
            else:
                return {}
            m = {"bt": per_key, "b1t": per_key[:, None], "b11t": per_key[:, None, None]}[layout]
        elif keep is None:
            return {}
        else:
            m = {"tt": keep, "btt": keep.expand(Bn, *keep.shape),
                 "b1tt": keep[None, None]}[layout]
        if self.convention == "additive":  # in the inputs' dtype, as a model builds it
            fill = torch.finfo(dtype).min if dtype.is_floating_point else -1e30
            return {self.mask_name: torch.zeros(m.shape, dtype=dtype).masked_fill(~m, fill)}
        return {self.mask_name: (~m if self.convention == "masked" else m).clone()}

    def eval(self, m: Any) -> Any:
        """``m.eval()`` for a module (a NumPy class has no training mode)."""
        return m.eval() if hasattr(m, "eval") and callable(m.eval) else m

    def call(self, m: nn.Module, xq: torch.Tensor, xkv: torch.Tensor | None = None, *,
             keep: torch.Tensor | None = None, lens: torch.Tensor | None = None) -> torch.Tensor:
        """The batch-first output of ``m`` on batch-first inputs (raises what ``m`` raises)."""
        Bn, Tq, Tk = xq.shape[0], xq.shape[1], (xq if xkv is None else xkv).shape[1]
        if self.layout is None and self.convention in ("masked", "keep", "additive") and (
                keep is not None or lens is not None or not self.mask_optional):
            self.layout = self._find_layout(m, xq, xkv, keep, lens)
        kw = self._mask(keep, lens, self.layout or "tt", Bn, Tq, Tk, xq.dtype)
        xs = [xq] if self.self_only else [xq, xkv if xkv is not None else xq,
                                          xkv if xkv is not None else xq]
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
        out = unwrap_out(m(*arrays, **named))
        if self.numpy:
            out = torch.from_numpy(np.array(out))
        for i, (b, a) in enumerate(zip(before, xs + list(kw.values()))):
            if self.mutation is None and not torch.equal(b, a.detach()):
                what = (["query", "key", "value"] if not self.self_only else ["x"])[i] \
                    if i < len(xs) else self.mask_name
                self.mutation = Finding(
                    "mutates-input", f"the module writes into its input {what} (an in-place "
                    f"op on it): the caller's tensor changes", f"{what} differs after the call",
                    reproducer=self.repro([
                        "before = x.clone()", "run(x)" if self.self_only else "run(x, x, x)",
                        "assert torch.equal(x, before), 'the module wrote into its input'"]))
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
        for layout in (KEY_ONLY + layouts) if self.prefer_key_only else (layouts + KEY_ONLY):
            self.layout = layout
            try:
                out = self.call(m, xq, xkv, keep=keep, lens=lens)
            except Exception as err:
                self.tried_layouts.append(f"{SHAPES[layout]}: {type(err).__name__}: "
                                          f"{(str(err).splitlines() or [''])[0][:100]}")
                continue
            if tuple(out.shape) == (xq.shape[0], xq.shape[1], E):
                return layout
            self.tried_layouts.append(f"{SHAPES[layout]}: output shape {tuple(out.shape)}")
        self.layout = None
        raise NoMaskLayout("; ".join(self.tried_layouts))

    # -- reproducer text ------------------------------------------------------------------
    def repro(self, body: list[str], dtype: str | None = None, dropout: bool = False) -> str:
        """A reproducer: build the module as the check did (eval mode, dropout 0 unless
        ``dropout``), make ``x`` and ``run()``, then ``body``."""
        if self.built.expr:
            load = self.built.load_lines
            build = self.built.expr
        else:
            load = [f"factory = ...  # {self.name}: your module's class or factory"]
            build = "factory(16, 4)"
        tr = "" if self.batch_first else ".transpose(0, 1)"
        lines = (["import numpy as np"] if self.numpy else []) + [
            "import torch", "from attnkit.check import load_target", "", *load,
            "torch.manual_seed(0)"] + (["np.random.seed(0)"] if self.numpy else []) + [
            f"m = {build}"]
        if not self.numpy and not dropout:
            if self._knobs is None:
                self._knobs = dropout_knobs(self.fresh(), 0.0)
            lines += ["m.eval()"] + [f"{k}  # dropout off, as in the check" for k in self._knobs]
        if dtype:
            lines.append(f"m = m.to(torch.{dtype})")
        lines += [f"x = torch.randn({B}, {T}, {E}, generator=torch.Generator().manual_seed(0))"
                  + (f".to(torch.{dtype})" if dtype else ""), "",
                  "def run(*inputs, **mask):"]
        if not self.mask_optional and self.convention != "none" and self.mask_name:
            lines += ["    if not mask:  # forward's mask is required: one that masks nothing",
                      "        Tq, Tk = inputs[0].shape[1], inputs[-1].shape[1]",
                      f"        mask = {{{self.mask_name!r}: {self._nothing_masked_text()}}}"]
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
        return "\n".join(lines + body)

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

    def mask_text(self, keep_lines: list[str], lens: str | None = None) -> tuple[list[str], str]:
        """Lines making the mask the module takes, and the keyword text that passes it."""
        if self.convention == "valid_lens":
            return [f"valid_lens = torch.tensor({lens})"], f"{self.mask_name}=valid_lens"
        if self.layout in KEY_ONLY and lens is None:
            keep_lines = keep_lines + [f"keep = keep[-1].expand({B}, -1)  # per key: the same "
                                       f"for every query"]
            shaped = {"bt": "keep", "b1t": "keep[:, None]", "b11t": "keep[:, None, None]"}[
                self.layout]
        elif self.layout in KEY_ONLY:
            keep_lines = [f"keep = torch.arange({T})[None, :] < torch.tensor({lens})[:, None]"
                          f"  # keys j < {lens}[b] count"]
            shaped = {"bt": "keep", "b1t": "keep[:, None]", "b11t": "keep[:, None, None]"}[
                self.layout]
        else:
            shaped = {"tt": "keep", "btt": f"keep.expand({B}, -1, -1)",
                      "b1tt": "keep[None, None]"}[self.layout or "tt"]
        if self.convention == "additive":
            return keep_lines + [
                f"mask = torch.zeros({shaped}.shape, dtype=x.dtype).masked_fill(~{shaped}, "
                f"torch.finfo(x.dtype).min)  # additive: 0 = may attend"], f"{self.mask_name}=mask"
        flip = f"~{shaped}" if self.convention == "masked" else shaped
        note = "True = masked" if self.convention == "masked" else "True = may attend"
        return keep_lines + [f"mask = {flip}  # {note}"], f"{self.mask_name}=mask"

    def call_words(self) -> str:
        """How the module is called, in words (for the report)."""
        inputs = ("x" if self.self_only else ", ".join(
            f"{n}=" for n in self.input_names) if self.input_names else "query, key, value")
        mask = (f", {self.mask_name}=..." if self.mask_name and self.convention != "none"
                else "")
        return f"m({inputs}{mask}) on {'(B, T, E)' if self.batch_first else '(T, B, E)'} inputs"

    def args_text(self, x: str, kv: str | None = None) -> str:
        return x if self.self_only else f"{x}, {kv or x}, {kv or x}"

    # -- probes ---------------------------------------------------------------------------
    def polarity(self) -> str | None:
        """``"masked"``, ``"keep"`` or ``"additive"``: given a mask flagging keys 0 and 1,
        which keys does the module ignore? For each reading, the keys it says are ignored
        get a random change, a different one per key (one shared change would not do: a
        softmax over those keys cannot see it). Raises :class:`NoMaskLayout` when the
        module takes no mask layout the check knows."""
        x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
        noise = 2 * _rand(B, T, E, seed=5)
        # The first keys are flagged: a causal module's early rows see no later key, so the
        # rows compared for each reading are ones a causal module lets see the changed keys.
        flag = torch.zeros(T, T, dtype=torch.bool)
        flag[:, :2] = True
        no_layout = None
        for reading, cols in (("masked", slice(0, 2)), ("keep", slice(2, None)),
                              ("additive", slice(0, 2))):
            self.convention = "additive" if reading == "additive" else "keep"
            self.layout = None
            keep = ~flag if reading == "additive" else flag
            changed = kv.clone()
            changed[:, cols] += noise[:, cols]
            try:
                a = self.call(self.eval(self.m), kv if self.self_only else x, kv, keep=keep)
                b = self.call(self.m, changed if self.self_only else x, changed, keep=keep)
            except NoMaskLayout as err:
                no_layout = err
                continue
            except Exception:
                continue
            if self.self_only:  # the queries are the keys: compare unchanged rows only
                other = slice(2, None) if cols.start == 0 else slice(0, 2)
                a, b = a[:, other], b[:, other]
            if torch.isfinite(a).all() and torch.allclose(a, b, atol=1e-5):
                return reading
        self.layout = None
        if no_layout is not None:
            raise no_layout
        return None

    def causality(self) -> bool | None:
        """Does a change at positions 3 and 4 leave the outputs at 0..2 alone (self-attention:
        ``m(x)``, or ``m(x, x, x)``)? None when the module cannot be called so."""
        x = _rand(B, T, E, seed=6)
        y = x.clone()
        y[:, 3:] += 2 * _rand(B, 2, E, seed=7)
        try:
            with torch.no_grad():
                a, b = self.call(self.eval(self.m), x), self.call(self.m, y)
        except Exception:
            return None
        self.behaves_causal = bool(torch.allclose(a[:, :3], b[:, :3], atol=1e-5))
        return self.behaves_causal

    def causal_leak(self) -> Finding:
        """The error finding for a module declared causal whose early outputs see later
        positions."""
        msg = ("declared causal, the module lets position i see later positions: changing "
               "x at positions 3 and 4 changes the outputs at 0..2 (apply the causal mask, "
               "e.g. scores.masked_fill(~torch.tril(...), -inf), before the softmax)")
        return Finding("causal-leak", msg, "outputs at positions 0..2 moved",
                       reproducer=self.repro([
            "y = x.clone()", "y[:, 3:] += 1.0  # change only the later positions",
            f"a, b = run({self.args_text('x')}), run({self.args_text('y')})",
            f"assert torch.allclose(a[:, :3], b[:, :3], atol=1e-5), {msg!r}"]))

    def unregistered(self) -> list[Finding]:
        registered = {id(p) for p in self.m.parameters()}
        missing: list[str] = []
        holders: list[str] = []
        for mod_path, mod in self.m.named_modules():
            for attr, value in vars(mod).items():
                if attr.startswith("_"):
                    continue
                base = f"{mod_path}.{attr}" if mod_path else attr
                for path, obj in _walk(value, base, depth=0):
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
            f"self.{holders[0]} holds tensors the module does not register ({len(missing)}, "
            f"e.g. {first}): .parameters() (so the optimizer), .to()/.half() and state_dict() "
            f"never see them; keep modules in nn.ModuleList/nn.ModuleDict and tensors in "
            f"nn.Parameter/nn.ParameterList", f"{len(missing)} unregistered: "
            + ", ".join(missing[:6]) + (" ..." if len(missing) > 6 else ""),
            reproducer=self.repro([
                "registered = {id(p) for p in m.parameters()}",
                f"p = m.{first}",
                f"assert id(p) in registered, 'm.{first} is not a registered parameter'"]))]

    def shapes(self) -> list[Finding]:
        found = []
        sizes = [(T, T)] if self.self_only else [(T, T), (3, 7), (7, 3)]
        for Tq, Tk in sizes:
            xq, xkv = _rand(B, Tq, E), _rand(B, Tk, E, seed=1)
            try:
                out = self.call(self.eval(self.m), xq, xkv)
            except Exception as err:
                self.broken = Tq == Tk
                first = f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:150]}"
                msg = f"the module raises on query {(B, Tq, E)}, key/value {(B, Tk, E)}: {first}"
                code = "shape"
                if self.broken:  # not even the plainest call: the check could not call it
                    code, msg = "call-failed", (
                        f"the module could not be called as {self.call_words()}: {first}; "
                        f"declare the mask with --convention, or wrap the module in a factory "
                        f"whose forward takes (query, key, value) or (x)")
                found.append(Finding(code, msg, type(err).__name__, reproducer=self.repro([
                    f"kv = torch.randn({B}, {Tk}, {E})" if Tk != T or Tq != T else "kv = x",
                    f"q = torch.randn({B}, {Tq}, {E})" if Tq != T else "q = x",
                    f"out = run({self.args_text('q', 'kv')})"])))
                break
            if tuple(out.shape) != (B, Tq, E):
                self.broken = Tq == Tk
                found.append(Finding("shape", f"output shape {tuple(out.shape)}, expected "
                                     f"{(B, Tq, E)} (query length Tq = {Tq}, key length {Tk})",
                                     reproducer=self.repro([
                                         f"q, kv = torch.randn({B}, {Tq}, {E}), "
                                         f"torch.randn({B}, {Tk}, {E})",
                                         f"out = run({self.args_text('q', 'kv')})",
                                         f"assert out.shape == ({B}, {Tq}, {E}), out.shape"])))
                break
        return found + ([self.mutation] if self.mutation else [])

    def mixes_queries(self) -> list[Finding]:
        """Does changing query row 4 leave output rows 0..3 alone (``m(query, key, value)``
        only: each query's output depends on its own query and the keys/values)? Heads
        split with ``view(B, H, T, Dk)``, or merged with ``view(B, T, E)`` without
        transposing back, mix tokens: a change at one query moves other queries' rows."""
        if self.self_only:
            return []  # m(x): the query is also a key, and positional encodings mix rows
        x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
        y = x.clone()
        y[:, T - 1] += 2 * _rand(B, E, seed=9)
        m = self.eval(self.m)
        try:
            with torch.no_grad():
                a, again, b = self.call(m, x, kv), self.call(m, x, kv), self.call(m, y, kv)
        except Exception:
            return []  # the shape probe says what the module raises
        if a.shape != (B, T, E) or b.shape != (B, T, E):
            return []  # a shape finding
        if not torch.allclose(a, again, rtol=1e-6, atol=1e-6):
            return []  # random (dropout on): nondeterministic or dropout-in-eval says so
        if not (torch.isfinite(a).all() and torch.isfinite(b).all()):
            return []  # nan-or-inf says what is wrong
        rows = slice(0, T - 1)
        if torch.allclose(a[:, rows], b[:, rows], rtol=1e-5, atol=1e-5):
            return []
        moved = [i for i in range(T - 1)
                 if not torch.allclose(a[:, i], b[:, i], rtol=1e-5, atol=1e-5)]
        msg = (f"changing query {T - 1} alone changes the outputs of queries {moved}: a "
               f"query's output must depend only on its own query and the keys/values. The "
               f"heads are split or merged so that tokens mix: split with "
               f"x.view(B, T, H, Dk).transpose(1, 2), not x.view(B, H, T, Dk); merge with "
               f"out.transpose(1, 2).contiguous().view(B, T, E), not out.view(B, T, E)")
        short = ("changing one query changed other queries' outputs: heads split/merged "
                 "without transpose(1, 2)")
        return [Finding("mixes-queries", msg,
                        f"outputs of queries {moved} moved, max change "
                        f"{float((a - b)[:, rows].abs().max()):.3g}",
                        reproducer=self.repro([
                            f"kv = torch.randn({B}, {T}, {E}, "
                            f"generator=torch.Generator().manual_seed(1))",
                            "y = x.clone()",
                            f"y[:, {T - 1}] += 1.0  # change only the last query",
                            "a, b = run(x, kv, kv), run(y, kv, kv)",
                            f"assert torch.allclose(a[:, :{T - 1}], b[:, :{T - 1}], "
                            f"atol=1e-5), {short!r}"]))]

    def large_logits(self) -> list[Finding]:
        x = _rand(B, T, E)
        for c in (30.0, 100.0):
            out = self.call(self.eval(self.m), c * x)
            if not torch.isfinite(out).all():
                return [Finding(
                    "nan-or-inf", "the module gives NaN/inf for finite inputs whose scores reach "
                    "~1e3-1e4: a softmax without the max trick overflows exp(); subtract "
                    "the row maximum first (torch.softmax does)",
                    f"{int((~torch.isfinite(out)).sum())} of {out.numel()} outputs non-finite "
                    f"at inputs x {c:g}",
                    reproducer=self.repro([f"out = run({self.args_text(f'{c:g} * x')})",
                                           "print(out[0, 0])",
                                           "assert torch.isfinite(out).all(), "
                                           "'NaN/inf from finite inputs'"]))]
        return []

    def masks(self) -> list[Finding]:
        x, kv = _rand(B, T, E), _rand(B, T, E, seed=1)
        m = self.eval(self.m)
        # Self-attention masks keys 0 and 1 and watches rows 2..4, whose own tokens do not
        # change and which a causal module lets see those keys (lengths mask the last keys).
        early = self.self_only and self.convention != "valid_lens"
        masked_cols, kept_cols = (slice(0, 2), slice(2, None)) if early \
            else (slice(3, None), slice(0, 3))
        cols_text = "[:, :2]" if early else "[:, 3:]"
        keep = torch.ones(T, T, dtype=torch.bool)
        keep[:, masked_cols] = False
        lens = None if early else torch.tensor([3, 3])
        rows = kept_cols if self.self_only else slice(None)
        noise = 2 * _rand(B, T, E, seed=8)
        bumped = kv.clone()
        bumped[:, masked_cols] += noise[:, masked_cols]  # a different change per key
        xq = kv if self.self_only else x
        bq = bumped if self.self_only else x
        a = self.call(m, xq, kv, keep=keep, lens=lens)
        b = self.call(m, bq, bumped, keep=keep, lens=lens)
        words = "keys 0 and 1 are masked" if early else "keys 3 and 4 are masked"
        kl, kwt = self.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                                  f"keep{cols_text} = False  # {words}"],
                                 None if early else "[3, 3]")
        kvq = "kv" if self.self_only else "x"
        n_masked = 2
        body = kl + ["kv = torch.randn(2, 5, 16)", "bumped = kv.clone()",
                     f"bumped{cols_text} += 2 * torch.randn(2, {n_masked}, 16)"
                     f"  # change only the masked keys",
                     f"a = run({self.args_text(kvq, 'kv')}, {kwt})",
                     f"b = run({self.args_text('bumped' if self.self_only else 'x', 'bumped')},"
                     f" {kwt})"]
        rows_text = ("[:, 2:]" if early else "[:, :3]") if self.self_only else ""
        if not torch.allclose(a[:, rows], b[:, rows], atol=1e-5):
            code, msg = "inaccurate", "values at masked keys change the output: the mask is " \
                "ignored or misapplied"
            # The other reading is tested on rows that cannot see the changed keys; a causal
            # self-attention module's early rows see none of them, whatever it reads.
            if self.convention != "valid_lens" and not (self.self_only and self.behaves_causal):
                c_ = kv.clone()
                c_[:, kept_cols] += noise[:, kept_cols]
                rows2 = masked_cols if self.self_only else slice(None)
                a2 = self.call(m, xq, kv, keep=keep)
                b2 = self.call(m, c_ if self.self_only else x, c_, keep=keep)
                if torch.allclose(a2[:, rows2], b2[:, rows2], atol=1e-5):
                    code = "mask-polarity"
                    msg = (f"the module reads the mask the other way round from the "
                           f"'{self.convention}' convention: it attends exactly the keys the "
                           f"mask excludes")
            change = float((a - b)[:, rows].detach().abs().max())
            return [Finding(code, msg, f"max change {change:.3g}",
                            reproducer=self.repro(body + [
                                f"assert torch.allclose(a{rows_text}, b{rows_text}, atol=1e-5), "
                                f"{msg!r}"]))]
        # A query with no allowed key: query 0 (or, with valid_lens, all of batch row 0).
        keep = torch.ones(T, T, dtype=torch.bool)
        keep[0] = False
        lens = torch.tensor([0, T])
        bumped = kv.clone()
        bumped[:, 1:] += 3.0
        a = self.call(m, xq, kv, keep=keep, lens=lens)
        b = self.call(m, bq if not self.self_only else bumped, bumped, keep=keep, lens=lens)
        row = (slice(0, 1), slice(None)) if self.key_only \
            else (slice(None), slice(0, 1))
        kl, kwt = self.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                                  "keep[0] = False  # query 0 may attend no key"], f"[0, {T}]")
        sel = "[:1]" if self.key_only else "[:, :1]"
        body = kl + ["kv = torch.randn(2, 5, 16)", "bumped = kv.clone()",
                     "bumped[:, 1:] += 3.0",
                     f"a = run({self.args_text(kvq, 'kv')}, {kwt})",
                     f"b = run({self.args_text('bumped' if self.self_only else 'x', 'bumped')},"
                     f" {kwt})", f"print(a{sel}, b{sel})"]
        if not torch.isfinite(a[row]).all():
            msg = "a query with no allowed key gives NaN: guard empty rows so they give 0"
            return [Finding("nan-or-inf", msg, "NaN on the fully masked row",
                            reproducer=self.repro(body + [
                                f"assert torch.isfinite(a{sel}).all(), {msg!r}"]))]
        if not torch.allclose(a[row], b[row], atol=1e-5):
            why = ("an additive finfo.min mask leaves a uniform row, as transformers' eager "
                   "attention does" if self.convention == "additive"
                   else "a -1e9 fill leaves a uniform row")
            msg = (f"a query with no allowed key still averages the values ({why}); attnkit, "
                   f"SDPA and flash-attn give attention output 0")
            return [Finding("fully-masked-row", msg, "its output moves with the values",
                            reproducer=self.repro(body + [
                                f"assert torch.allclose(a{sel}, b{sel}), {msg!r}"]))]
        return []

    def half(self, dtype: str) -> list[Finding]:
        m16 = self.fresh()
        dropout_knobs(m16, 0.0)
        m16 = m16.to(getattr(torch, dtype)).eval()
        x = _rand(B, T, E).to(getattr(torch, dtype))
        keep = torch.ones(T, T, dtype=torch.bool)
        keep[0] = False
        has_mask = self.convention != "none"
        kw = dict(keep=keep, lens=torch.tensor([0, T])) if has_mask else {}
        try:
            out = self.call(m16, x, **kw)
            problem = None if torch.isfinite(out).all() else "NaN/inf in the output"
        except Exception as err:
            problem = f"{type(err).__name__}: {str(err).splitlines()[0][:150] if str(err) else ''}"
        if problem is None:
            return []
        try:
            m32 = self.fresh()
            dropout_knobs(m32, 0.0)
            twin = self.call(m32.eval(), x.float(), **kw)
            if not torch.isfinite(twin).all():
                return []  # not a half-precision problem (nan-or-inf says it)
        except Exception:
            return []
        body: list[str] = []
        call = f"out = run({self.args_text('x')})"
        if has_mask:
            kl, kwt = self.mask_text(["keep = torch.ones(5, 5, dtype=torch.bool)",
                                      "keep[0] = False  # query 0 may attend no key"],
                                     f"[0, {T}]")
            body, call = kl, f"out = run({self.args_text('x')}, {kwt})"
        return [Finding("float16-overflow", f"the module fails in {dtype} where float32 is "
                        f"fine ({problem}); a -1e9 fill does not fit in float16: use -inf or "
                        f"torch.finfo(dtype).min and softmax in float32", problem,
                        reproducer=self.repro(body + [
                            call, "print(out[0, :2])", f"assert torch.isfinite(out).all(), "
                            f"'NaN/inf in {dtype} where float32 is finite'"],
                                              dtype=dtype))]


def _walk(value: Any, path: str, depth: int):
    """``(path, object)`` of modules and tensors inside plain lists, tuples and dicts."""
    if isinstance(value, (nn.Module, torch.Tensor)):
        if depth > 0 or isinstance(value, torch.Tensor):
            yield path, value
        return
    if depth > 2:
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            yield from _walk(item, f"{path}[{i}]", depth + 1)
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _walk(item, f"{path}[{key!r}]", depth + 1)


def unwrap_out(result: Any) -> torch.Tensor:
    return result[0] if isinstance(result, (tuple, list)) else result
