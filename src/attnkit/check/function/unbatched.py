"""A function written for one sequence: a softmax over a ``(Tq, Tk)`` matrix, an attention
over ``(T, D)`` inputs of one head (``q @ k.T``). The checks call it through a wrapper,
once per batch row and head, and stack what it returns; a reproducer defines the same
wrapper from the same source, so it calls the function as the check did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..catalogue import T, join
from ..core.repro import note

__all__ = ["WRAPPER", "unbatched"]

# Source of the wrapper: ``one`` is the function that takes one sequence. Its docstring
# and comment are sentences, in the report's language where a reproducer prints it.
WRAPPER = join([
    'def fn(*args, **kw):',
    '    """' + T("repro.one-sequence") + '"""',
    '    lead = tuple(args[0].shape[:-2])',
    '    n = int(np.prod(lead))',
    '',
    note("    def row(a, i):", "repro.row-of"),
    '        if hasattr(a, "shape") and tuple(a.shape[:len(lead)]) == lead:',
    '            return a.reshape((n,) + tuple(a.shape[len(lead):]))[i]',
    '        return a',
    '',
    '    outs = [one(*(row(a, i) for a in args), **{k: row(a, i) for k, a in kw.items()})',
    '            for i in range(n)]',
    '',
    '    def stack(parts):',
    '        if isinstance(parts[0], np.ndarray):',
    '            joined = np.stack(parts)',
    '        else:',
    '            import torch',
    '            joined = torch.stack(parts)',
    '        return joined.reshape(lead + tuple(joined.shape[1:]))',
    '',
    '    if isinstance(outs[0], (tuple, list)):',
    '        return tuple(stack([o[j] for o in outs]) for j in range(len(outs[0])))',
    '    return stack(outs)',
    '',
], "line")


def unbatched(fn: Any) -> Any:
    """``fn`` wrapped to take batched inputs ``(..., T, D)``: called once per sequence.

    Args:
        fn: a function of 2-D inputs (``(T, D)`` queries, keys and values, or a
            ``(Tq, Tk)`` matrix of scores), and perhaps a mask for that sequence.

    Returns:
        A function of batched inputs whose output is ``fn``'s outputs stacked,
        ``(..., Tq, Dv)`` (a tuple ``(out, weights)`` stacked element by element).
    """
    namespace: dict = {"np": np, "one": fn}
    exec(WRAPPER, namespace)  # our own source, the one a reproducer prints
    wrapper = namespace["fn"]
    wrapper.__qualname__ = getattr(fn, "__qualname__", "fn")
    wrapper.__wrapped__ = fn  # what inspect.unwrap (and a look at the source) finds
    return wrapper
