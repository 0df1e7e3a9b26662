"""How a checked function is called, for the checker and for the reproducers it prints.

:class:`Target` knows the function, its framework, convention and layout, and builds the
same call twice: as Python objects (:meth:`Target.parts`, :meth:`Target.invoke`) and as
source text (:meth:`Target.call_text`), so a reproducer calls ``fn`` exactly as the checker
did. How the signature is read (inputs by name, a flag that is not a mask, a required
``scaling``): :func:`attnkit.check.meet.adapt.read_call`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import numpy as np

from ..catalogue import note
from .adapt import Call, Framework, unwrap

__all__ = ["Target", "additive_fill"]


def additive_fill(framework: Framework, dtype: str) -> float:
    """The value an additive mask puts at a masked key: the most negative finite number of
    ``dtype`` (what transformers builds its masks with)."""
    if framework.name == "torch":
        return float(framework.torch.finfo(getattr(framework.torch, dtype)).min)
    return float(np.finfo(np.dtype(dtype)).min)


@dataclass
class Target:
    """A function under check.

    Attributes:
        fn: the function.
        check: ``"softmax"``, ``"masked-softmax"`` or ``"attention"``.
        framework: NumPy or PyTorch.
        convention: ``"valid_lens"``, ``"masked"``, ``"keep"``, ``"sdpa"``, ``"additive"``
            or ``"none"``.
        heads: attention inputs carry a head axis, ``(B, H, T, D)``.
        mask_default: the mask argument may be left out (it has a default).
        spec: a ``load_target`` string for reproducers, or None.
        name: what the report calls it.
        call: how the signature says to call it (inputs by name, the mask's name, the
            required parameters that are filled).
        out_layout: ``"bhtd"``, or ``"bthd"`` when ``fn`` returns its output as
            ``(B, Tq, H, Dv)`` (transformers' eager attention): it is transposed back.
        in_layout: ``"bhtd"``, or ``"bthd"`` when ``fn`` takes its inputs as
            ``(B, T, H, D)`` (JAX, flash-attn): they are transposed on the way in (the
            checker's arrays, the oracle and the gradients stay ``(B, H, T, D)``).
        mask_keys: the mask has one flag per key, ``(B, Tk)`` (a key padding mask).
        causal: ``fn`` applies a causal mask itself (declared with ``causal=True``, or
            found by behaviour: ``causal_found``).
        causal_found: not declared, ``fn`` was seen to mask the future: a case whose
            output is that of attention over every key is judged so (a function may be
            causal for self-attention, ``Tq == Tk``, and not for cross-attention).
        load: source lines that bind ``fn`` in a reproducer, when ``load_target(spec)``
            alone does not give it (a class the checker built: ``fn = Cls(dropout=0.0)``).
    """

    fn: Any
    check: str
    framework: Framework
    convention: str = "none"
    heads: bool = True
    mask_default: bool = True
    spec: str | None = None
    name: str = "fn"
    call: Call = field(default_factory=Call)
    out_layout: str = "bhtd"
    causal: bool = False
    load: str = ""
    in_layout: str = "bhtd"
    causal_found: bool = False
    mask_keys: bool = False

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("q", "k", "v") if self.check == "attention" else ("x",)

    def _mask_value(self, arrays: dict[str, np.ndarray], dtype: str) -> Any:
        """The mask argument of the convention, or None to leave it out."""
        conv, fw = self.convention, self.framework
        if conv in ("none", "sdpa"):
            return None
        if "valid_lens" in arrays and conv == "valid_lens":
            return fw.array(arrays["valid_lens"], "int64")
        keys = "keep_keys" if self.mask_keys else "keep"
        if keys in arrays and conv in ("masked", "keep", "additive"):
            keep = arrays[keys]
        elif self.mask_default:
            return None
        else:  # a required mask argument, and nothing masked: the mask that masks nothing
            x = arrays["x"] if "x" in arrays else arrays["q"]
            Tk = arrays["k"].shape[-2] if "k" in arrays else x.shape[-1]
            if conv == "valid_lens":
                return fw.array(np.full(x.shape[0], Tk), "int64")
            lead = x.shape[:1] if self.mask_keys else x.shape[:-2] + (x.shape[-2],)
            keep = np.ones(lead + (Tk,), dtype=bool)
        if conv == "additive":
            return fw.array(np.where(keep, 0.0, additive_fill(fw, dtype)), dtype)
        return fw.array(~keep if conv == "masked" else keep, "bool")

    def parts(self, arrays: dict[str, np.ndarray], dtype: str, causal: bool = False,
              grad: bool = False) -> tuple[list, list, dict]:
        """``(inputs, extra positional arguments, keyword arguments)`` for ``fn``: the
        inputs in ``dtype``, then the mask and the filled parameters."""
        fw = self.framework
        inputs = [fw.array(arrays[n], dtype, requires_grad=grad) for n in self.inputs]
        extra: list = []
        kw: dict = {}
        if self.convention == "sdpa":
            if "keep" in arrays and not causal:
                kw["attn_mask"] = fw.array(arrays["keep"], "bool")
            if causal:
                kw["is_causal"] = True
        mask = self._mask_value(arrays, dtype)
        if mask is not None:
            if self.call.mask_keyword and self.call.mask_name:
                kw[self.call.mask_name] = mask
            else:
                extra.append(mask)
        for name, how in self.call.fixed.items():
            kw[name] = self._fixed_value(arrays, how)
        return inputs, extra, kw

    def _fixed_value(self, arrays: dict[str, np.ndarray], how: str) -> Any:
        if how == "module":
            return SimpleNamespace(training=False, num_key_value_groups=1, is_causal=False)
        if how == "scale":
            return 1.0 / math.sqrt(arrays["q"].shape[-1]) if "q" in arrays else 1.0
        return {"zero": 0.0, "false": False, "true": True, "axis": -1}[how]

    def invoke(self, inputs: list, extra: list, kw: dict) -> Any:
        """Call ``fn``: the inputs by position or by name, then ``extra`` and ``kw``."""
        if self.in_layout == "bthd":  # views: a write into one reaches the caller's array
            inputs = [x.transpose(1, 2) if hasattr(x, "detach") else np.swapaxes(x, 1, 2)
                      for x in inputs]
        if self.call.input_names:
            return self.fn(*extra, **dict(zip(self.call.input_names, inputs)), **kw)
        return self.fn(*inputs, *extra, **kw)

    def output(self, result: Any) -> tuple[Any, Any]:
        """``(out, weights or None)`` of a result, ``out`` in the ``(B, H, Tq, Dv)`` layout
        the oracle gives."""
        out, weights = unwrap(result)
        if self.out_layout == "bthd" and getattr(out, "ndim", 0) == 4:
            out = out.transpose(1, 2) if hasattr(out, "detach") else np.swapaxes(out, 1, 2)
        return out, weights

    # -- the same call as text ------------------------------------------------------------
    def header(self, oracle_import: str) -> list[str]:
        """The imports of a reproducer and the lines that bind ``fn`` (one item, which may
        hold several lines: a :class:`~attnkit.check.catalogue.Text` keeps its comments in
        every language)."""
        if self.load or self.spec:
            load = self.load or f"fn = load_target({self.spec!r})"
        elif self.name.isidentifier():  # defined where the check ran: a notebook, a session
            load = note(f"fn = {self.name}", "repro.fn-notebook")
        else:
            load = note("fn = ...", "repro.fn-named", name=self.name)
        stand_in = (["from types import SimpleNamespace"]
                    if "module" in self.call.fixed.values() else [])
        loader = ["from attnkit.check import load_target"] if "load_target" in load else []
        return stand_in + self.framework.imports() + [*loader, oracle_import, "", load]

    def convert_lines(self, dtype: str, grad: bool = False) -> list[str]:
        fw = self.framework
        big = [n.upper() for n in self.inputs]
        if len(big) == 1:
            return [f"{big[0]} = {fw.convert_text(self.inputs[0], dtype, grad)}"]
        conv = fw.convert_text("a", dtype, grad)
        return [f"{', '.join(big)} = ({conv} for a in ({', '.join(self.inputs)}))"]

    def _mask_text(self, arrays: dict[str, np.ndarray], dtype: str) -> str | None:
        conv, fw = self.convention, self.framework

        def arr(expr: str) -> str:
            return f"torch.from_numpy({expr})" if fw.name == "torch" else expr

        if conv in ("none", "sdpa"):
            return None
        if conv == "valid_lens" and "valid_lens" in arrays:
            return arr("valid_lens")
        x = "K" if self.check == "attention" else "X"
        keys = "keep_keys" if self.mask_keys else "keep"
        if keys in arrays and conv in ("masked", "keep", "additive"):
            keep = keys
        elif self.mask_default:
            return None
        elif conv == "valid_lens":
            return arr(f"np.full({self.inputs[0].upper()}.shape[0], {x}.shape[-2])")
        elif self.mask_keys:
            keep = "np.ones(K.shape[:1] + K.shape[-2:-1], dtype=bool)"
        else:
            keep = ("np.ones(Q.shape[:-1] + K.shape[-2:-1], dtype=bool)"
                    if self.check == "attention" else "np.ones(X.shape, dtype=bool)")
        if conv == "additive":
            if fw.name == "torch":
                return (f"torch.from_numpy(np.where({keep}, 0.0, torch.finfo(torch.{dtype}).min))"
                        f".to(torch.{dtype})")
            return f"np.where({keep}, 0.0, np.finfo(np.{dtype}).min).astype(np.{dtype})"
        if conv == "masked":
            return arr(f"~{keep}" if keep.startswith("keep")
                       else keep.replace("np.ones", "np.zeros"))
        return arr(keep)

    def call_text(self, arrays: dict[str, np.ndarray], causal: bool = False,
                  dtype: str = "float32") -> str:
        big = [n.upper() for n in self.inputs]
        if self.in_layout == "bthd":  # fn takes (B, T, H, D)
            big = [f"{b}.transpose(1, 2)" if self.framework.name == "torch"
                   else f"np.swapaxes({b}, 1, 2)" for b in big]
        parts = ([f"{n}={b}" for n, b in zip(self.call.input_names, big)]
                 if self.call.input_names else big)
        fw = self.framework
        if self.convention == "sdpa":
            if "keep" in arrays and not causal:
                parts.append("attn_mask=" + ("torch.from_numpy(keep)" if fw.name == "torch"
                                             else "keep"))
            if causal:
                parts.append("is_causal=True")
        mask = self._mask_text(arrays, dtype)
        if mask is not None:
            if self.call.mask_keyword and self.call.mask_name:
                parts.append(f"{self.call.mask_name}={mask}")
            elif self.call.input_names:  # invoke() passes it first, the inputs by name
                parts.insert(0, mask)
            else:
                parts.append(mask)
        for name, how in self.call.fixed.items():
            value = self._fixed_value(arrays, how)
            parts.append(f"{name}=SimpleNamespace(training=False, num_key_value_groups=1, "
                         f"is_causal=False)" if how == "module" else f"{name}={value!r}")
        return f"fn({', '.join(parts)})"

    def got_lines(self, arrays: dict[str, np.ndarray], causal: bool = False,
                  dtype: str = "float32") -> list[str]:
        lines = [f"result = {self.call_text(arrays, causal, dtype)}",
                 "out = result[0] if isinstance(result, (tuple, list)) else result"]
        if self.out_layout == "bthd":
            lines.append(note("out = out.transpose(1, 2)" if self.framework.name == "torch"
                              else "out = np.swapaxes(out, 1, 2)", "repro.fn-returns"))
        return lines + [f"got = {self.framework.to_float64_text('out')}"]
