"""``vjp``: one entry point to the hand-written backward of every attnkit.numpy op.

In the style of ``jax.vjp``::

    out, pullback = vjp(scaled_dot_product_attention, q, k, v, causal=True)
    dq, dk, dv = pullback(d_out)

``out`` is exactly what ``fn(*args, **options)`` returns. ``pullback(d_out)`` returns a
:class:`Grads` tuple with one gradient per *positional* argument, each with its argument's
shape and float dtype (None for arguments that are not differentiable, such as
``valid_lens`` or a ``key=None`` passed positionally). For ops that return
``(out, weights)`` or ``(out, lse)``, ``d_out`` is the cotangent of the first output.

The ``bias`` option's gradient, reduced to the bias's own broadcast shape, is
``pullback(d_out).bias`` (None when no bias was given); the ``sinks`` option's, ``(H,)``,
is ``pullback(d_out).sinks``. The backward formulas themselves
live next to their forward (``*_backward`` in softmax.py, masks.py, attention.py, flash.py,
mha.py); this module only wires arguments to them.

:func:`check_vjp` compares a pullback with central finite differences.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np

from .additive import additive_attention, additive_backward, additive_forward
from .attention import (
    scaled_dot_product_attention,
    sdpa_backward,
    sdpa_forward,
    sum_to_shape,
)
from .flash import flash_attention, flash_attention_backward
from .masks import masked_softmax, masked_softmax_backward
from .mha import MultiHeadParams, mha_backward, mha_forward, multi_head_attention
from .softmax import (
    compute_dtype,
    log_softmax,
    log_softmax_backward,
    logsumexp,
    logsumexp_backward,
    result_dtype,
    softmax,
    softmax_backward,
)

__all__ = ["Grads", "Pullback", "check_vjp", "vjp"]


class Grads(tuple):
    """What a pullback returns: a tuple with one gradient per positional argument, plus
    ``.bias``, the gradient of the ``bias`` option in the bias's own shape, and
    ``.sinks``, the gradient of the ``sinks`` option ``(H,)`` (each None when not given)."""

    bias: np.ndarray | None
    sinks: np.ndarray | None

    def __new__(
        cls, grads: tuple[Any, ...], bias: np.ndarray | None = None,
        sinks: np.ndarray | None = None,
    ) -> Grads:
        self = super().__new__(cls, grads)
        self.bias = bias
        self.sinks = sinks
        return self


Pullback = Callable[[np.ndarray], Grads]
# A rule takes the bound arguments (name -> value, defaults applied) and returns the output
# and a function from d_out to a dict of gradients by argument name.
_Backward = Callable[[np.ndarray], dict[str, Any]]
_Rule = Callable[[dict[str, Any]], tuple[Any, _Backward]]


def _out_dtype(*arrays: Any) -> np.dtype:
    return result_dtype(np.result_type(*(np.asarray(a).dtype for a in arrays)))


def _like(grad: np.ndarray, x: Any) -> np.ndarray:
    """``grad`` in the float dtype its argument ``x`` comes back in."""
    return grad.astype(result_dtype(np.asarray(x).dtype), copy=False)


def _options(args: dict[str, Any], *names: str) -> dict[str, Any]:
    return {name: args[name] for name in names}


_MASKS = ("mask", "bias", "valid_lens", "causal", "window", "dropout_p", "rng")
_VARIANTS = ("softcap", "sinks", "segment_ids")


def _softmax_rule(fn: Callable[..., np.ndarray], backward: Callable[..., np.ndarray]) -> _Rule:
    def rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
        x = np.asarray(args["x"])
        # fn computes in compute_dtype and casts; do the same but keep the wide result.
        y = fn(x.astype(compute_dtype(x.dtype), copy=False), axis=args["axis"])
        out = y.astype(result_dtype(x.dtype), copy=False)

        def back(d_out: np.ndarray) -> dict[str, Any]:
            return {"x": _like(backward(y, d_out, axis=args["axis"]), x)}

        return out, back

    return rule


def _logsumexp_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    x = np.asarray(args["x"])
    axis, keepdims = args["axis"], args["keepdims"]
    lse = logsumexp(x.astype(compute_dtype(x.dtype), copy=False), axis=axis, keepdims=keepdims)
    out = lse.astype(result_dtype(x.dtype), copy=False)

    def back(d_out: np.ndarray) -> dict[str, Any]:
        return {"x": _like(logsumexp_backward(x, lse, d_out, axis=axis, keepdims=keepdims), x)}

    return out, back


def _masked_softmax_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    scores = np.asarray(args["scores"])
    wide = scores.astype(compute_dtype(scores.dtype), copy=False)
    y = masked_softmax(wide, args["valid_lens"], mask=args["mask"], axis=args["axis"])
    out = y.astype(result_dtype(scores.dtype), copy=False)

    def back(d_out: np.ndarray) -> dict[str, Any]:
        return {"scores": _like(masked_softmax_backward(y, d_out, axis=args["axis"]), scores)}

    return out, back


def _sdpa_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    q, k, v, bias = args["q"], args["k"], args["v"], args["bias"]
    out, cache, scale = sdpa_forward(
        q, k, v, scale=args["scale"], **_options(args, *_MASKS, *_VARIANTS)
    )
    dt = _out_dtype(q, k, v)
    result = (out.astype(dt, copy=False), cache.weights.astype(dt, copy=False))

    def back(d_out: np.ndarray) -> dict[str, Any]:
        dq, dk, dv, d_scores, d_sinks = sdpa_backward(d_out, q, k, v, cache, scale)
        grads = {"q": _like(dq, q), "k": _like(dk, k), "v": _like(dv, v)}
        if bias is not None:
            grads["bias"] = _like(sum_to_shape(d_scores, np.shape(bias)), bias)
        if d_sinks is not None:
            grads["sinks"] = _like(d_sinks, args["sinks"])
        return grads

    return result, back


def _additive_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    names = ("q", "k", "v", "w_q", "w_k", "w_v")
    arrays = [args[n] for n in names]
    out, cache, features = additive_forward(*arrays, **_options(args, *_MASKS))
    dt = _out_dtype(*arrays)
    result = (out.astype(dt, copy=False), cache.weights.astype(dt, copy=False))

    def back(d_out: np.ndarray) -> dict[str, Any]:
        *grads, d_scores = additive_backward(d_out, *arrays, cache, features)
        out_grads: dict[str, Any] = {n: _like(g, a) for n, g, a in zip(names, grads, arrays)}
        if args["bias"] is not None:
            bias = args["bias"]
            out_grads["bias"] = _like(sum_to_shape(d_scores, np.shape(bias)), bias)
        return out_grads

    return result, back


def _flash_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    q, k, v = args["q"], args["k"], args["v"]
    band = _options(args, "causal", "window", "scale", "block_q", "block_k", *_VARIANTS)
    # The backward gets the LSE in float64: float32 gradients stay exact at large logits.
    out, lse = flash_attention(q, k, v, num_threads=args["num_threads"], return_lse=True,
                               lse_dtype=np.float64, **band)

    def back(d_out: np.ndarray) -> dict[str, Any]:
        dq, dk, dv, *d_sinks = flash_attention_backward(d_out, q, k, v, out, lse, **band)
        grads = {"q": _like(dq, q), "k": _like(dk, k), "v": _like(dv, v)}
        if d_sinks:
            grads["sinks"] = _like(d_sinks[0], args["sinks"])
        return grads

    if not args["return_lse"]:
        return out, back
    stats = compute_dtype(np.result_type(*(np.asarray(x).dtype for x in (q, k, v))))
    want = stats if args["lse_dtype"] is None else args["lse_dtype"]
    return (out, lse.astype(np.result_type(stats, want))), back


def _mha_rule(args: dict[str, Any]) -> tuple[Any, _Backward]:
    params, query, key, value = args["params"], args["query"], args["key"], args["value"]
    if not isinstance(params, MultiHeadParams):
        raise TypeError(f"params must be a MultiHeadParams, got {type(params).__name__}")
    y, cache = mha_forward(
        params, query, key, value, scale=args["scale"],
        **_options(args, *_MASKS, *_VARIANTS),
    )
    result = (
        y.astype(_out_dtype(query, params.w_q), copy=False),
        cache.attention.weights.astype(_out_dtype(query, params.w_q), copy=False),
    )

    def back(d_out: np.ndarray) -> dict[str, Any]:
        d_params, d_query, d_key, d_value, d_scores, d_sinks = mha_backward(d_out, params, cache)
        # Self-attention defaults (value = key, key = query) reuse one array in several
        # roles; its gradient is the sum over the roles.
        if value is None:
            d_key = d_key + d_value
        if key is None:
            d_query = d_query + d_key
        grads: dict[str, Any] = {
            "params": MultiHeadParams(
                **{name: _like(getattr(d_params, name), a) for name, a in params.items()}
            ),
            "query": _like(d_query, query),
            "key": None if key is None else _like(d_key, key),
            "value": None if value is None else _like(d_value, value),
        }
        if args["bias"] is not None:
            bias = args["bias"]
            grads["bias"] = _like(sum_to_shape(d_scores, np.shape(bias)), bias)
        if d_sinks is not None:
            grads["sinks"] = _like(d_sinks, args["sinks"])
        return grads

    return result, back


_RULES: dict[Callable[..., Any], _Rule] = {
    softmax: _softmax_rule(softmax, softmax_backward),
    log_softmax: _softmax_rule(log_softmax, log_softmax_backward),
    logsumexp: _logsumexp_rule,
    masked_softmax: _masked_softmax_rule,
    scaled_dot_product_attention: _sdpa_rule,
    additive_attention: _additive_rule,
    flash_attention: _flash_rule,
    multi_head_attention: _mha_rule,
}


def vjp(fn: Callable[..., Any], *args: Any, **options: Any) -> tuple[Any, Pullback]:
    """Run ``fn(*args, **options)`` and return its output with a pullback.

    Args:
        fn: one of :func:`softmax`, :func:`log_softmax`, :func:`logsumexp`,
            :func:`masked_softmax`,
            :func:`scaled_dot_product_attention`, :func:`additive_attention`,
            :func:`flash_attention`, :func:`multi_head_attention`.
        *args: its positional arguments (arrays; for ``multi_head_attention``
            ``params, query[, key, value]``).
        **options: its keyword options (``mask``, ``bias``, ``valid_lens``, ``causal``,
            ``window``, ``scale``, ``softcap``, ``sinks``, ``segment_ids``, ``dropout_p``,
            ``rng``, ...), passed through.

    Returns:
        ``(out, pullback)``: ``out`` is what ``fn`` returns; ``pullback(d_out)`` takes the
        cotangent of ``out`` (of its first element when ``fn`` returns a pair) and returns a
        :class:`Grads` tuple, one gradient per positional argument (a
        :class:`MultiHeadParams` for ``params``; None for non-differentiable ones), with the
        bias gradient as ``.bias`` and the sinks gradient as ``.sinks``. With dropout, the
        pullback uses the forward's mask.
    """
    rule = _RULES.get(fn)
    if rule is None:
        names = ", ".join(sorted(f.__name__ for f in _RULES))
        raise TypeError(f"vjp has no backward rule for {fn!r}; supported: {names}")
    bound = inspect.signature(fn).bind(*args, **options)
    bound.apply_defaults()
    positional = list(bound.arguments)[: len(args)]
    out, backward = rule(dict(bound.arguments))
    first = out[0] if isinstance(out, tuple) else out

    def pullback(d_out: np.ndarray) -> Grads:
        d_out = np.asarray(d_out)
        if d_out.shape != first.shape:
            raise ValueError(
                f"d_out has shape {d_out.shape}, but {fn.__name__}'s output has shape "
                f"{first.shape}"
            )
        grads = backward(d_out)
        return Grads(
            tuple(grads.get(name) for name in positional), bias=grads.get("bias"),
            sinks=grads.get("sinks"),
        )

    return out, pullback


def check_vjp(
    fn: Callable[..., Any],
    *args: Any,
    eps: float = 1e-3,
    seed: int = 0,
    **options: Any,
) -> dict[str, float]:
    """Compare ``vjp(fn, ...)`` with central finite differences, one argument at a time.

    For each differentiable positional argument ``x`` (and ``bias`` and ``sinks``, when
    given) draws a random direction ``u`` and a random cotangent ``g`` and compares
    ``<pullback(g)_x, u>`` with the central difference
    ``D(e) = (<g, f(x + e u)> - <g, f(x - e u)>) / (2 e)``, Richardson-extrapolated as
    ``(4 D(eps/2) - D(eps)) / 3`` (error ``O(eps^4)``, so a large ``eps`` keeps rounding
    noise small).
    For a :class:`MultiHeadParams` argument every parameter array is checked on its own.
    Use float64 inputs; entries that are ``-inf`` (excluded by a bias) are not perturbed.

    Args:
        fn, *args, **options: as for :func:`vjp`.
        eps: the larger finite-difference step.
        seed: seeds the directions and the cotangent.

    Returns:
        ``{argument name: relative error}``, the relative error being
        ``|analytic - numeric| / max(|analytic|, |numeric|)``. When both are below
        ``1e-10 * sum|g * out|`` (the resolution of the differences, e.g. the key bias of
        softmax attention, whose true gradient is 0) the error is 0.
    """
    rng = np.random.default_rng(seed)
    out, pullback = vjp(fn, *args, **options)
    first = out[0] if isinstance(out, tuple) else out
    g = rng.standard_normal(np.shape(first))
    grads = pullback(g)
    names = list(inspect.signature(fn).parameters)[: len(args)]

    def objective(new_args: list[Any], new_options: dict[str, Any]) -> float:
        res = fn(*new_args, **new_options)
        res = np.asarray(res[0] if isinstance(res, tuple) else res, dtype=np.float64)
        # -inf outputs (log_softmax of an excluded entry) do not move; NaN still shows.
        return float(np.sum(np.where(np.isinf(res), 0.0, res * g)))

    def direction(x: np.ndarray) -> np.ndarray:
        return np.where(np.isfinite(x), rng.standard_normal(np.shape(x)), 0.0)

    # Below this, a directional derivative is finite-difference noise (rounding in the
    # objective divided by eps): both sides are taken as exactly 0.
    size = np.abs(np.where(np.isinf(first), 0.0, np.asarray(first, dtype=np.float64)) * g)
    noise = 1e-10 * max(1.0, float(np.sum(size)))

    def compare(analytic: np.ndarray, u: np.ndarray, shift: Callable[[np.ndarray], float]) -> float:
        a = float(np.sum(analytic * u))
        wide = (shift(eps * u) - shift(-eps * u)) / (2 * eps)
        narrow = (shift(0.5 * eps * u) - shift(-0.5 * eps * u)) / eps
        # Richardson: the central difference errs by c eps^2 + O(eps^4); this cancels c.
        n = (4.0 * narrow - wide) / 3.0
        denom = max(abs(a), abs(n))
        return 0.0 if denom < noise else abs(a - n) / denom

    errors: dict[str, float] = {}
    for i, (name, x, grad) in enumerate(zip(names, args, grads)):
        if grad is None:
            continue
        if isinstance(x, MultiHeadParams):
            for pname, arr in x.items():
                u = direction(arr)

                def shift_p(
                    du: np.ndarray, i: int = i, pname: str = pname, x: MultiHeadParams = x
                ) -> float:
                    moved = list(args)
                    moved[i] = MultiHeadParams(
                        **{n: (a + du if n == pname else a) for n, a in x.items()}
                    )
                    return objective(moved, options)

                errors[f"{name}.{pname}"] = compare(getattr(grad, pname), u, shift_p)
            continue
        x = np.asarray(x, dtype=np.float64)
        u = direction(x)

        def shift(du: np.ndarray, i: int = i, x: np.ndarray = x) -> float:
            moved = list(args)
            moved[i] = x + du
            return objective(moved, options)

        errors[name] = compare(grad, u, shift)
    for option, grad in (("bias", grads.bias), ("sinks", grads.sinks)):
        if grad is None:
            continue
        b = np.asarray(options[option], dtype=np.float64)
        u = direction(b)

        def shift_o(du: np.ndarray, option: str = option, b: np.ndarray = b) -> float:
            return objective(list(args), {**options, option: b + du})

        errors[option] = compare(grad, u, shift_o)
    return errors
