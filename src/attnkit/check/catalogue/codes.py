"""Every finding code of ``attnkit check``, once: its severity in each kind of check.

The words of a code (its title, what is wrong, why it matters, how to fix it) are in the
language files (:mod:`.en`, :mod:`.zh`); its reference page, with a wrong example and the
fix, is generated from both (``python -m attnkit.check.catalogue --write-docs``). Adding a
code: a :class:`Code` here, its words in every language file, the check that finds it and
its test.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CATALOGUE", "ERROR", "KINDS", "WARNING", "Code", "severity"]

ERROR, WARNING = "error", "warning"
KINDS = ("function", "multi-head", "model")


@dataclass(frozen=True)
class Code:
    """One finding code.

    Attributes:
        name: the stable code (scripts match on it).
        function, multihead, model: its severity in a function check (softmax,
            masked softmax, attention), a multi-head check (and a block check:
            ``check_block`` judges a module, so a ``"block"`` report takes the multi-head
            severities), a model check: ``"error"``
            for a defect the user must fix, ``"warning"`` for a convention peers
            disagree on.
    """

    name: str
    function: str = ERROR
    multihead: str = ERROR
    model: str = ERROR

    def severity(self, kind: str) -> str:
        """The severity in ``kind`` (``"function"``, ``"multi-head"`` or ``"model"``)."""
        return {"function": self.function, "multi-head": self.multihead,
                "model": self.model}[kind]


# In the order a report lists them.
_ALL = (
    Code("call-failed"),
    Code("nondeterministic"),
    Code("shape"),
    Code("nan-or-inf"),
    Code("float16-overflow"),
    Code("mask-polarity"),
    Code("mask-mismatch"),
    Code("wrong-scale"),
    Code("inaccurate"),
    Code("mutates-input"),
    Code("gradient"),
    Code("unregistered-parameter"),
    Code("no-gradient"),
    Code("state-dict"),
    Code("dropout-in-eval"),
    Code("causal-leak"),
    Code("padding-ignored"),
    Code("mixes-queries"),
    # Found by check_block only (a "block" report takes the multi-head column). A post-norm
    # block is not a bug in itself (the original Transformer is one), but check_block asks
    # for pre-norm, and a block that is not what was asked is an error there; the other
    # kinds never find either code, so their column is the same, not a verdict.
    Code("post-norm"),
    Code("residual"),
    # Peers disagree: attnkit, SDPA (2.5+) and flash-attn give 0, JAX and d2l a uniform row.
    Code("fully-masked-row", WARNING, WARNING, WARNING),
    # A convention for a lone function (SDPA and JAX align is_causal top-left), a defect
    # inside a model: its own mask is bottom-right, so a top-left function changes what
    # it computes with a KV cache.
    Code("causal-alignment", WARNING, WARNING, ERROR),
    # A layout, not a bug: a function written for one (T, D) sequence, checked per row/head.
    Code("one-sequence", WARNING, WARNING, WARNING),
)

CATALOGUE: dict[str, Code] = {c.name: c for c in _ALL}


def severity(code: str, kind: str = "function") -> str:
    """The severity of ``code`` in a check of ``kind``."""
    return CATALOGUE[code].severity(kind)
