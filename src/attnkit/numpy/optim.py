"""Optimizers for NumPy parameters: SGD (with momentum) and Adam/AdamW, as in ``torch.optim``.

Parameters are a tree of float arrays: a :class:`~attnkit.numpy.MultiHeadParams`, a dict
of arrays, or dicts/lists/tuples nesting those (e.g. ``{"embed": E, "attn": params}``).
The optimizer keeps a reference to that tree and updates its arrays **in place** on each
:meth:`Optimizer.step`, so the model holding them sees the new values, as with
``torch.optim``. NumPy arrays carry no ``.grad``, so the gradients are passed to ``step``
in a tree of the same structure (what :func:`attnkit.numpy.vjp`'s pullback returns for a
``MultiHeadParams``); a leaf whose gradient is missing or None is skipped, like a torch
parameter whose ``.grad`` is None. There is therefore no ``zero_grad``.

State (momentum buffers, Adam moments and per-parameter step counts) is created lazily at
a parameter's first step, exactly as torch does, and :meth:`Optimizer.reset` clears it.
The update formulas follow the ``torch.optim`` documentation, so the same gradients give
the same parameters (the tests check this against torch).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .mha import MultiHeadParams

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "named_arrays"]


def named_arrays(tree: Any, prefix: str = "") -> Iterator[tuple[str, np.ndarray | None]]:
    """``(dotted name, array)`` for every leaf of a parameter tree, in a fixed order."""
    if isinstance(tree, MultiHeadParams):
        for name, arr in tree.items():
            yield prefix + name, arr
    elif isinstance(tree, Mapping):
        for name, sub in tree.items():
            yield from named_arrays(sub, f"{prefix}{name}.")
    elif isinstance(tree, (list, tuple)):
        for i, sub in enumerate(tree):
            yield from named_arrays(sub, f"{prefix}{i}.")
    elif tree is None or isinstance(tree, np.ndarray):
        yield prefix.rstrip("."), tree
    else:
        raise TypeError(
            f"parameter tree leaf {prefix.rstrip('.') or '<root>'} is a {type(tree).__name__};"
            " expected an ndarray, MultiHeadParams, dict, list or tuple"
        )


class Optimizer:
    """Base class: walks the parameter tree and applies :meth:`update` to each leaf.

    Args:
        params: the parameter tree; its arrays must be writeable floating arrays.
        lr: the learning rate (may be changed between steps, e.g. by a schedule).
    """

    def __init__(self, params: Any, lr: float) -> None:
        if lr < 0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        self.params = params
        self.lr = float(lr)
        self._leaves: dict[str, np.ndarray] = {}
        for name, arr in named_arrays(params):
            if arr is None:
                continue
            if not np.issubdtype(arr.dtype, np.floating) or not arr.flags.writeable:
                raise TypeError(
                    f"parameter {name} must be a writeable floating array, got dtype "
                    f"{arr.dtype} (writeable={arr.flags.writeable})"
                )
            self._leaves[name] = arr
        self.state: dict[str, dict[str, Any]] = {}

    def step(self, grads: Any) -> None:
        """Update every parameter in place from ``grads`` (a tree shaped like ``params``)."""
        given = dict(named_arrays(grads))
        unknown = sorted(set(given) - set(self._leaves))
        if unknown:
            raise ValueError(f"gradients for unknown parameters {unknown}")
        for name, p in self._leaves.items():
            g = given.get(name)
            if g is None:
                continue
            if g.shape != p.shape:
                raise ValueError(f"gradient of {name} has shape {g.shape}, parameter {p.shape}")
            state = self.state.setdefault(name, {"step": 0})
            state["step"] += 1
            self.update(p, g.astype(p.dtype, copy=False), state)

    def update(self, p: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Forget all state (momentum, moments, step counts); parameters are untouched."""
        self.state.clear()


class SGD(Optimizer):
    """Stochastic gradient descent, ``torch.optim.SGD`` semantics.

    ``g += weight_decay * p``; with momentum ``buf = momentum * buf + (1 - dampening) * g``
    (``buf = g`` at the first step), then ``g = buf`` (or ``g + momentum * buf`` with
    Nesterov); finally ``p -= lr * g``.
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        *,
        momentum: float = 0.0,
        dampening: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        if momentum < 0 or weight_decay < 0:
            raise ValueError(
                f"momentum and weight_decay must be >= 0, got {momentum}, {weight_decay}"
            )
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum needs momentum > 0 and dampening = 0")
        self.momentum, self.dampening = momentum, dampening
        self.nesterov, self.weight_decay = nesterov, weight_decay

    def update(self, p: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        if self.weight_decay:
            g = g + self.weight_decay * p
        if self.momentum:
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = g.copy()
            else:
                buf *= self.momentum
                buf += (1.0 - self.dampening) * g
            g = g + self.momentum * buf if self.nesterov else buf
        p -= self.lr * g


class Adam(Optimizer):
    """Adam, ``torch.optim.Adam`` semantics (L2 ``weight_decay`` added to the gradient).

    ``m = b1 m + (1 - b1) g``, ``v = b2 v + (1 - b2) g^2``, and
    ``p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)``, ``t`` the parameter's
    step count.
    """

    decoupled = False

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
    ) -> None:
        super().__init__(params, lr)
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must lie in [0, 1), got {betas}")
        self.betas, self.eps, self.weight_decay = betas, eps, weight_decay

    def update(self, p: np.ndarray, g: np.ndarray, state: dict[str, Any]) -> None:
        b1, b2 = self.betas
        if self.weight_decay:
            if self.decoupled:
                p *= 1.0 - self.lr * self.weight_decay
            else:
                g = g + self.weight_decay * p
        if "exp_avg" not in state:
            state["exp_avg"] = np.zeros_like(p)
            state["exp_avg_sq"] = np.zeros_like(p)
        m, v, t = state["exp_avg"], state["exp_avg_sq"], state["step"]
        m *= b1
        m += (1.0 - b1) * g
        v *= b2
        v += (1.0 - b2) * g * g
        denom = np.sqrt(v) / math.sqrt(1.0 - b2**t) + self.eps
        p -= (self.lr / (1.0 - b1**t)) * m / denom


class AdamW(Adam):
    """Adam with decoupled weight decay (``p *= 1 - lr * weight_decay`` before the Adam
    step), ``torch.optim.AdamW`` semantics; ``weight_decay`` defaults to 0.01 as there."""

    decoupled = True

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        *,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(params, lr, betas=betas, eps=eps, weight_decay=weight_decay)
