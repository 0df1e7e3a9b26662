"""Meeting the user's code where it is: telling NumPy from PyTorch, reading a calling
convention off a signature, and turning results back into float64 (loading the target
itself: :mod:`attnkit.check.meet.targets`, whose names are re-exported here).

Conventions (what the argument after the inputs means):

==============  ==========================================================================
``valid_lens``  ``fn(q, k, v, valid_lens)``: keys ``j < valid_lens[b]`` are valid (d2l)
``masked``      ``fn(q, k, v, mask)``: bool, True = masked out (masked_fill(mask, ...) code)
``keep``        ``fn(q, k, v, mask)``: bool, True = may attend (JAX, attnkit)
``sdpa``        ``fn(q, k, v, attn_mask=None, is_causal=False)``: bool True = may attend
``additive``    ``fn(q, k, v, attention_mask)``: float, 0 = may attend, ``finfo.min`` =
                masked, added to the scores (transformers' eager attention)
``none``        ``fn(q, k, v)``: no mask argument
==============  ==========================================================================

The call is read off the signature (:func:`read_call`): inputs go by name where the names
say which is query, key and value; a parameter with a bool/number default or a flag's name
(``scale``, ``dropout``, ``training``, ``retain_derived``) is never fed a mask.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .targets import TargetLoadError, load_target, notebook_cells, origin_of, target_spec

__all__ = ["CONVENTIONS", "Call", "Framework", "TargetLoadError", "load_target",
           "mask_parameter", "notebook_cells", "origin_of", "read_call", "target_spec", "unwrap"]

CONVENTIONS = ("auto", "valid_lens", "masked", "keep", "sdpa", "additive", "none")
LENS_NAMES = ("valid_lens", "valid_len", "valid_length", "valid_lengths", "lens", "lengths",
               "seq_lens", "key_lens")
# Names that say which input is the query, the key and the value.
QKV_NAMES = (("query", "key", "value"), ("q", "k", "v"), ("queries", "keys", "values"),
             ("query_states", "key_states", "value_states"), ("xq", "xk", "xv"))
# Names of a mask whose polarity is fixed: True = ignore this key (PyTorch's key_padding_mask).
PADDING_NAMES = ("key_padding_mask", "padding_mask", "src_key_padding_mask", "pad_mask")
# Parameters that are not a mask (a flag, a scale, a dropout), and what a required one gets.
SCALE_NAMES = ("scale", "scaling", "softmax_scale", "sm_scale", "scale_factor", "temperature")
FLAG_WORDS = ("drop", "train", "scale", "scaling", "retain", "return", "need", "causal",
              "average", "temperature", "window", "deterministic", "verbose", "eps", "bias",
              "head", "dim", "cache", "past", "position", "output", "use_")


@dataclass
class Call:
    """How a function (or a module's ``forward``) is called, read off its signature.

    Attributes:
        input_names: pass the inputs by these names (``("query", "key", "value")``), or
            None to pass them by position, first.
        mask_name: the mask parameter, or None when there is none (or it cannot be read).
        mask_keyword: pass the mask by name (it does not come right after the inputs).
        mask_default: the mask may be left out.
        guessed: the convention its name says (``valid_lens``, ``masked`` for a key padding
            mask, ``sdpa``), ``none`` when there is no mask, None when behaviour must say.
        fixed: required parameters that are not inputs nor the mask, and what they get:
            ``"scale"`` (1/sqrt(Dk)), ``"zero"`` (a dropout), ``"false"``/``"true"`` (a
            flag), ``"module"`` (a stand-in for the calling layer: ``training=False``,
            ``num_key_value_groups=1``, as transformers' attention functions read it) or
            ``"axis"`` (a softmax's required ``dim``/``axis``: -1).
        unfilled: required parameters the check cannot fill (the call will fail).
        flags: the parameters after the inputs that were read as flags, not masks.
    """

    input_names: tuple[str, ...] | None = None
    mask_name: str | None = None
    mask_keyword: bool = False
    mask_default: bool = True
    guessed: str | None = "none"
    fixed: dict[str, str] = field(default_factory=dict)
    unfilled: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)


def _is_flag(p: inspect.Parameter) -> bool:
    """A parameter that is not a mask: a bool/number/str default, or a flag's name."""
    default = p.default
    if default is not inspect.Parameter.empty and default is not None:
        return True  # True, 0.1, "mean"...: a flag or a knob, never a mask
    name = p.name.lower()
    return "mask" not in name and any(w in name for w in FLAG_WORDS)


def _fill(p: inspect.Parameter) -> str | None:
    """What a required non-mask parameter gets, or None when the check cannot tell."""
    name = p.name.lower()
    if name in SCALE_NAMES:
        return "scale"
    if "drop" in name:
        return "zero"
    if name == "module":  # the calling layer, as transformers' attention functions take it
        return "module"
    if name in ("training", "is_training", "train", "deterministic"):
        return "true" if name == "deterministic" else "false"
    return None


def read_call(fn: Any, n_inputs: int) -> Call:
    """How to call ``fn`` with ``n_inputs`` inputs (3: q, k, v; 1: x) and a mask.

    Args:
        fn: a function, a bound method, or an object whose ``forward`` (an ``nn.Module``)
            or ``__call__`` says what it takes.
        n_inputs: 3 for attention, 1 for a softmax or a self-attention module.

    Returns:
        A :class:`Call`; an unreadable signature gives positional inputs and an optional
        mask whose convention behaviour must say.
    """
    if not inspect.isroutine(fn) and callable(getattr(fn, "forward", None)):
        fn = fn.forward  # an nn.Module: its forward says what it takes
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return Call(guessed=None)
    params = [p for p in params if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    by_name = {p.name: p for p in params}
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    call = Call()
    inputs = positional[:n_inputs]
    if n_inputs == 3:
        for names in QKV_NAMES:
            found = [next((p for p in params if p.name.lower() == n), None) for n in names]
            if all(p is not None and p.kind != p.POSITIONAL_ONLY for p in found):
                if [p.name for p in positional[:3]] != [p.name for p in found]:
                    call.input_names = tuple(p.name for p in found)  # type: ignore[union-attr]
                inputs = found  # type: ignore[assignment]
                break
    if n_inputs == 1 and not positional:  # forward(self, *, x, mask=None): x by name
        keyword = [p for p in params if p.kind == p.KEYWORD_ONLY and "mask" not in p.name.lower()
                   and p.default is inspect.Parameter.empty]
        if keyword:
            call.input_names, inputs = (keyword[0].name,), keyword[:1]
    if len(inputs) < n_inputs and call.input_names is None:
        return call  # fewer named parameters than inputs (*args): inputs by position only
    used = {p.name for p in inputs}
    rest = [p for p in params if p.name not in used]
    if n_inputs == 3 and "attn_mask" in by_name and "is_causal" in by_name:
        call.mask_name, call.guessed, call.mask_keyword = "attn_mask", "sdpa", True
        return call
    mask = next((p for p in rest if p.name.lower() in LENS_NAMES), None)
    guess: str | None = "valid_lens" if mask is not None else None
    if mask is None:
        mask = next((p for p in rest if p.name.lower() in ("mask", "attn_mask",
                                                           "attention_mask")), None)
    if mask is None:
        mask = next((p for p in rest if p.name.lower() in PADDING_NAMES), None)
        guess = "masked" if mask is not None else None
    if mask is None:
        mask = next((p for p in rest if "mask" in p.name.lower()), None)
    if mask is None:  # an unnamed parameter right after the inputs, if it is no flag
        after = [p for p in positional if p.name not in used]
        if after and positional.index(after[0]) == n_inputs and not _is_flag(after[0]):
            mask = after[0]
    for p in rest:
        if p is mask:
            continue
        if p.default is inspect.Parameter.empty and p.kind != p.VAR_POSITIONAL:
            # a softmax's required axis (softmax(x, dim)) gets the last one, as a default would
            how = "axis" if n_inputs == 1 and p.name.lower() in ("dim", "axis") else _fill(p)
            if how is None:
                call.unfilled.append(p.name)
            else:
                call.fixed[p.name] = how
        elif p in positional and positional.index(p) >= n_inputs:
            call.flags.append(p.name)
    if mask is None:
        return call
    call.mask_name, call.guessed = mask.name, guess
    call.mask_default = mask.default is not inspect.Parameter.empty
    in_place = mask in positional and positional.index(mask) == n_inputs
    call.mask_keyword = (call.input_names is not None or not in_place) \
        and mask.kind != mask.POSITIONAL_ONLY
    return call


def unwrap(result: Any) -> tuple[Any, Any]:
    """``(out, weights or None)`` from ``out`` or ``(out, weights)``."""
    if isinstance(result, (tuple, list)):
        if len(result) == 0:
            raise TypeError("fn returned an empty tuple")
        return result[0], (result[1] if len(result) > 1 else None)
    return result, None


def mask_parameter(fn: Any, n_inputs: int) -> tuple[str | None, bool, str | None]:
    """``(name, has_default, convention guessed from the names)`` of the mask parameter
    (see :func:`read_call`); name None when there is none or the signature is unreadable."""
    call = read_call(fn, n_inputs)
    return call.mask_name, call.mask_default, call.guessed


class Framework:
    """How inputs are made and results read, for ``"numpy"`` or ``"torch"``."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "torch":
            import torch

            self.torch = torch

    def array(self, x: np.ndarray, dtype: str, requires_grad: bool = False) -> Any:
        """``x`` in ``dtype`` (bool and integer arrays keep their own dtype)."""
        x = np.asarray(x)
        if self.name == "numpy":
            return x.astype(dtype) if x.dtype.kind == "f" else x.copy()
        t = self.torch.from_numpy(np.array(x))
        if x.dtype.kind == "f":
            t = t.to(getattr(self.torch, dtype))
            if requires_grad:
                t.requires_grad_(True)
        return t

    def float64(self, x: Any) -> np.ndarray:
        """A float64 NumPy copy of an array or tensor."""
        if hasattr(x, "detach"):
            return x.detach().cpu().double().numpy()
        return np.array(x, dtype=np.float64)

    def rounded(self, x: np.ndarray, dtype: str) -> np.ndarray:
        """``x`` rounded to ``dtype`` and back to float64 (what ``fn`` really receives)."""
        if np.asarray(x).dtype.kind != "f":
            return np.asarray(x)
        return self.float64(self.array(x, dtype))

    def snapshot(self, x: Any) -> Any:
        return x.detach().clone() if hasattr(x, "detach") else np.array(x, copy=True)

    def same(self, a: Any, b: Any) -> bool:
        """Equal shapes and values (NaN equal to NaN)."""
        a, b = self._numpy(a), self._numpy(b)
        return bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))

    def _numpy(self, x: Any) -> np.ndarray:
        if hasattr(x, "detach"):
            x = x.detach().cpu()
            if x.dtype == self.torch.bfloat16:  # NumPy has none; float32 holds it exactly
                x = x.float()
            return x.numpy()
        return np.asarray(x)

    def is_result(self, x: Any) -> bool:
        if self.name == "torch":
            return isinstance(x, self.torch.Tensor)
        return isinstance(x, np.ndarray)

    # -- text for reproducers ---------------------------------------------------------
    def imports(self) -> list[str]:
        return ["import numpy as np"] + (["import torch"] if self.name == "torch" else [])

    def convert_text(self, name: str, dtype: str, grad: bool = False) -> str:
        """Code that turns the float64 NumPy array ``name`` into ``fn``'s input."""
        if self.name == "numpy":
            return f"{name}.astype(np.{dtype})" if dtype else f"{name}.copy()"
        if not dtype:
            return f"torch.from_numpy({name}.copy())"
        return (f"torch.from_numpy({name}).to(torch.{dtype})"
                + (".requires_grad_()" if grad else ""))

    def to_float64_text(self, name: str) -> str:
        if self.name == "torch":
            return f"{name}.detach().double().numpy()"
        return f"np.asarray({name}, dtype=np.float64)"
