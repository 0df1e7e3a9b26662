"""The spine every kind of check follows: **prepare** (meet the user's code: build it, read
its call, probe its layout and conventions, write the report's header) -> **cases** (what
to run it on) -> **judge** (each case against the float64 oracle, a finding per defect) ->
**reproduce** (a program that shows each finding failing). The report is rendered apart
(:mod:`attnkit.check.render`), in any language of the catalogue.

A kind of check is a class with the four steps (:class:`Check`) and :func:`follow` runs
them. The function check (:class:`attnkit.check.function.check.FunctionCheck`), the
multi-head check (:class:`attnkit.check.multihead.check.MultiHeadCheck`) and the block
check (:class:`attnkit.check.block.check.BlockCheck`) follow it; the model check
(:mod:`attnkit.check.model`) has its own driver still.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Protocol

from .report import Finding, Report

__all__ = ["Check", "follow"]


class Check(Protocol):
    """One kind of check of one piece of user code, writing into :attr:`report`."""

    report: Report

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


def follow(check: Check) -> Report:
    """Run ``check`` along the spine: prepare, then judge every case, adding each finding
    to the report as it is found (each case judged before the next is asked for), then
    finish; returns the report."""
    if check.prepare():
        for case in check.cases():
            for finding in check.judge(case):
                check.report.add(finding)
        check.finish()
    return check.report
