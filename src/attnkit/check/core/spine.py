"""The spine every kind of check follows: **prepare** (meet the user's code: build it, read
its call, probe its layout and conventions, write the report's header) -> **cases** (what
to run it on) -> **judge** (each case against the float64 oracle, a finding per defect) ->
**reproduce** (a program that shows each finding failing) -> **finish** (what the cases
together show). The report is rendered apart (:mod:`attnkit.check.render`), in any
language of the catalogue.

A kind of check is a class with these steps (:class:`Check`) and :func:`follow` runs them,
adding every finding :meth:`Check.judge` yields to the check's report (anything with an
``add``, :class:`Collects`). Every kind follows it: the function check
(:class:`attnkit.check.function.check.FunctionCheck`), the multi-head check
(:class:`attnkit.check.multihead.check.MultiHeadCheck`) and the block check
(:class:`attnkit.check.block.check.BlockCheck`) write into a
:class:`~attnkit.check.core.report.Report`; the model checks
(:class:`attnkit.check.model.check.ModelCheck` for transformers models, one case per
implementation, and :class:`attnkit.check.model.any_model.AnyModelCheck` for any PyTorch
model, one case: its forward) into a :class:`~attnkit.check.model.report.ModelReport`,
which hands each finding to the result of the implementation it was found under.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from .report import Finding

__all__ = ["Check", "Collects", "follow"]


class Collects(Protocol):
    """What a check writes its findings into."""

    def add(self, finding: Finding) -> None:
        """Keep ``finding`` (the first of its code: the cases run smallest first)."""


R = TypeVar("R", bound=Collects, covariant=True)


class Check(Protocol[R]):
    """One kind of check of one piece of user code, writing into :attr:`report`."""

    @property
    def report(self) -> R:
        """The report the findings go into (its header written by :meth:`prepare`)."""

    def prepare(self) -> bool:
        """Meet the code; False when it cannot be run (the report already says why)."""

    def cases(self) -> Iterable[Any]:
        """The cases to judge, in order ([] when a probe found nothing can be compared).
        Each case is asked for after the one before it was judged, so an iterator may
        decide what follows from what was found (a module whose shapes are broken ends
        there)."""

    def judge(self, case: Any) -> Iterable[Finding]:
        """The findings of ``case``, each with its reproducer (:meth:`reproduce`); yielded
        one at a time, so that a finding already in the report can be skipped."""

    def reproduce(self, case: Any, verdict: Any) -> str:
        """A program that shows ``verdict`` on ``case`` failing (``""``: none)."""

    def finish(self) -> None:
        """What the cases together show (after the last one)."""


def follow(check: Check[R]) -> R:
    """Run ``check`` along the spine: prepare, then judge every case, adding each finding
    to the report as it is found (each case judged before the next is asked for), then
    finish; returns the report."""
    if check.prepare():
        for case in check.cases():
            for finding in check.judge(case):
                check.report.add(finding)
        check.finish()
    return check.report
