"""How a checked function is called, for the checker and for the reproducers it prints.

:class:`Target` knows the function, its framework, convention and layout, and builds the
same call twice: as Python objects (:meth:`Target.call`) and as source text
(:meth:`Target.call_text`), so a reproducer calls ``fn`` exactly as the checker did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .adapt import Framework

__all__ = ["Target"]


@dataclass
class Target:
    """A function under check.

    Attributes:
        fn: the function.
        check: ``"softmax"``, ``"masked-softmax"`` or ``"attention"``.
        framework: NumPy or PyTorch.
        convention: ``"valid_lens"``, ``"masked"``, ``"keep"``, ``"sdpa"`` or ``"none"``.
        heads: attention inputs carry a head axis, ``(B, H, T, D)``.
        mask_default: the mask argument may be left out (it has a default).
        spec: a ``load_target`` string for reproducers, or None.
        name: what the report calls it.
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
    load: str = ""

    @property
    def inputs(self) -> tuple[str, ...]:
        return ("q", "k", "v") if self.check == "attention" else ("x",)

    def _mask_arg(self, arrays: dict[str, np.ndarray], causal: bool) -> tuple[list, dict]:
        """The extra positional and keyword arguments of the convention."""
        conv = self.convention
        fw = self.framework
        if conv == "sdpa":
            kw: dict = {}
            if "keep" in arrays and not causal:
                kw["attn_mask"] = fw.array(arrays["keep"], "bool")
            if causal:
                kw["is_causal"] = True
            return [], kw
        if conv == "none":
            return [], {}
        if "valid_lens" in arrays and conv == "valid_lens":
            return [fw.array(arrays["valid_lens"], "int64")], {}
        if "keep" in arrays and conv in ("masked", "keep"):
            keep = arrays["keep"]
            return [fw.array(~keep if conv == "masked" else keep, "bool")], {}
        if self.mask_default:
            return [], {}
        # A required mask argument, and nothing masked: pass the mask that masks nothing.
        x = arrays["x"] if "x" in arrays else arrays["q"]
        Tk = (arrays["k"] if "k" in arrays else x).shape[-2 if "k" in arrays else -1]
        if conv == "valid_lens":
            return [fw.array(np.full(x.shape[0], Tk), "int64")], {}
        Tq = x.shape[-2]
        keep = np.ones(x.shape[:-2] + (Tq, Tk), dtype=bool)
        return [fw.array(~keep if conv == "masked" else keep, "bool")], {}

    def arguments(self, arrays: dict[str, np.ndarray], dtype: str, causal: bool = False,
                  grad: bool = False) -> tuple[list, dict]:
        """``(args, kwargs)`` for ``fn``: the inputs in ``dtype``, then the mask."""
        args = [self.framework.array(arrays[n], dtype, requires_grad=grad) for n in self.inputs]
        extra, kw = self._mask_arg(arrays, causal)
        return args + extra, kw

    # -- the same call as text ------------------------------------------------------------
    def header(self, oracle_import: str) -> list[str]:
        load = self.load or (f"fn = load_target({self.spec!r})" if self.spec
                             else f"fn = ...  # {self.name}: your function here")
        return self.framework.imports() + [
            "from attnkit.check import load_target", oracle_import, "", *load.splitlines()]

    def convert_lines(self, dtype: str, grad: bool = False) -> list[str]:
        fw = self.framework
        big = [n.upper() for n in self.inputs]
        if len(big) == 1:
            return [f"{big[0]} = {fw.convert_text(self.inputs[0], dtype, grad)}"]
        conv = fw.convert_text("a", dtype, grad)
        return [f"{', '.join(big)} = ({conv} for a in ({', '.join(self.inputs)}))"]

    def call_text(self, arrays: dict[str, np.ndarray], causal: bool = False) -> str:
        parts = [n.upper() for n in self.inputs]
        conv, fw = self.convention, self.framework

        def arr(expr: str) -> str:
            return f"torch.from_numpy({expr})" if fw.name == "torch" else expr

        if conv == "sdpa":
            if "keep" in arrays and not causal:
                parts.append(f"attn_mask={arr('keep')}")
            if causal:
                parts.append("is_causal=True")
        elif conv == "valid_lens" and "valid_lens" in arrays:
            parts.append(arr("valid_lens"))
        elif conv in ("masked", "keep") and "keep" in arrays:
            parts.append(arr("~keep" if conv == "masked" else "keep"))
        elif conv != "none" and not self.mask_default:
            x = "K" if self.check == "attention" else "X"
            if conv == "valid_lens":
                parts.append(arr(f"np.full({parts[0]}.shape[0], {x}.shape[-2])"))
            else:
                ones = (f"np.{'zeros' if conv == 'masked' else 'ones'}"
                        f"(Q.shape[:-1] + K.shape[-2:-1], dtype=bool)"
                        if self.check == "attention"
                        else f"np.{'zeros' if conv == 'masked' else 'ones'}(X.shape, dtype=bool)")
                parts.append(arr(ones))
        return f"fn({', '.join(parts)})"

    def got_lines(self, arrays: dict[str, np.ndarray], causal: bool = False) -> list[str]:
        return [f"result = {self.call_text(arrays, causal)}",
                "out = result[0] if isinstance(result, (tuple, list)) else result",
                f"got = {self.framework.to_float64_text('out')}"]
