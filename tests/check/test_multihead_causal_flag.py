"""``check_multi_head(..., causal=True)`` on a module whose forward takes its own causal
switch (attnkit's ``MultiHeadAttention(...)(x, causal=True)``): the check sets it in every
call and says so in the header; it called the module without it and reported a false
``causal-leak``. A module that takes the switch and ignores it still leaks."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import attnkit.torch as at  # noqa: E402
from attnkit.check import check_multi_head, load_target  # noqa: E402

FILE = "tests/check/impl_calls/causal_flag_modules.py"

pytestmark = pytest.mark.usefixtures("at_root")


def test_attnkits_own_module_declared_causal_gets_its_flag():
    report = check_multi_head(at.MultiHeadAttention, causal=True)
    assert report.findings == [], report.text()
    assert str(report.causality).startswith("behaves as causal"), report.causality
    assert "causal=True passed in every call" in report.causality
    assert "每次调用都传入 causal=True" in report.text(lang="zh")
    assert report.oracle["compared"] is True


def test_an_is_causal_switch_is_set_too():
    report = check_multi_head(load_target(f"{FILE}:HonoursIsCausal"), causal=True)
    assert report.findings == [], report.text()
    assert "is_causal=True passed in every call" in report.causality


def test_not_declared_causal_the_switch_is_left_alone():
    report = check_multi_head(at.MultiHeadAttention)
    assert report.findings == [], report.text()
    assert "passed in every call" not in report.causality


def test_a_switch_the_module_ignores_is_a_causal_leak():
    report = check_multi_head(load_target(f"{FILE}:IgnoresCausal"), causal=True)
    assert [f.code for f in report.findings] == ["causal-leak"], report.text()
    repro = report.findings[0].reproducer
    assert "mask['causal'] = True" in repro, repro
    with pytest.raises(AssertionError):  # runs as printed and fails, the switch set
        exec(compile(repro, "<reproducer>", "exec"), {"__name__": "__reproducer__"})


@pytest.mark.parametrize("name, built", [
    ("BuiltCausal", "causal=True"),
    ("FromConfigCausal", "is_causal=True"),
])
def test_declared_causal_a_constructors_switch_is_set(name, built):
    """The switch held by the constructor (or its config's field) was left at its default
    False: the module was built non-causal and got a false ``causal-leak``."""
    report = check_multi_head(load_target(f"{FILE}:{name}"), causal=True)
    assert report.findings == [], report.text()
    assert built in report.origin, report.origin
    assert str(report.causality).startswith("behaves as causal"), report.causality
    assert report.oracle["compared"] is True


def test_not_declared_causal_a_constructors_switch_keeps_its_default():
    report = check_multi_head(load_target(f"{FILE}:BuiltCausal"))
    assert report.findings == [], report.text()
    assert "causal=" not in report.origin, report.origin
    assert str(report.causality).startswith("bidirectional"), report.causality


def test_a_constructors_switch_the_module_ignores_is_a_causal_leak():
    report = check_multi_head(load_target(f"{FILE}:BuiltIgnoresCausal"), causal=True)
    assert [f.code for f in report.findings] == ["causal-leak"], report.text()
    repro = report.findings[0].reproducer
    assert "causal=True" in repro, repro
    with pytest.raises(AssertionError):  # runs as printed and fails, the switch set
        exec(compile(repro, "<reproducer>", "exec"), {"__name__": "__reproducer__"})
