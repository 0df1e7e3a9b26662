"""The spine (attnkit.check.core.spine): follow() asks for each case after the one before
was judged, so a kind of check can end its run, or skip a case, on what it found."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from attnkit.check.core.report import Finding, Report
from attnkit.check.core.spine import follow


class TwoCases:
    """Case "b" only when case "a" found nothing."""

    def __init__(self, a_finds: bool) -> None:
        self.report = Report("softmax", "two-cases")
        self.a_finds, self.judged, self.finished = a_finds, [], False

    def prepare(self) -> bool:
        return True

    def cases(self) -> Iterator[str]:
        yield "a"
        if not self.report.codes:
            yield "b"

    def judge(self, case: str) -> Iterator[Finding]:
        self.judged.append(case)
        if case == "a" and self.a_finds:
            yield Finding("shape", "a wrong shape", reproducer=self.reproduce(case, None))

    def reproduce(self, case: str, verdict: object) -> str:
        return f"# case {case}"

    def finish(self) -> None:
        self.finished = True


@pytest.mark.english_report  # its finding is made by hand from English words
@pytest.mark.parametrize("a_finds, judged", [(True, ["a"]), (False, ["a", "b"])])
def test_a_case_is_asked_for_after_the_one_before_was_judged(a_finds, judged):
    check = TwoCases(a_finds)
    report = follow(check)
    assert check.judged == judged and check.finished
    assert report.codes == (["shape"] if a_finds else [])


def test_a_multi_head_module_with_a_wrong_output_shape_ends_at_the_shapes_probe():
    pytest.importorskip("torch")
    from torch import nn

    from attnkit.check.multihead.check import MultiHeadCheck

    class HalfWidth(nn.Module):
        """Returns half the width it was built with: every later probe would fail on it."""

        def __init__(self, embed_dim, num_heads):
            super().__init__()
            self.proj = nn.Linear(embed_dim, embed_dim // 2)

        def forward(self, x):
            return self.proj(x)

    report = Report("multi-head", "HalfWidth")
    check = MultiHeadCheck(HalfWidth, "auto", False, report, None, "HalfWidth")
    assert check.prepare()
    probes = []
    for case in check.cases():
        probes.append(str(case.text))
        for finding in check.judge(case):
            report.add(finding)
    assert report.codes == ["shape"], report.text()
    assert probes[-1].startswith("shapes") and len(probes) == len(report.cases)
