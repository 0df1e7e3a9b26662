"""The catalogue of codes: one entry per code, the reference page made from it (and
committed as made), a link under every finding, the severities of each kind of check."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from attnkit.check import CODES, check_softmax
from attnkit.check.catalogue import CATALOGUE, KINDS, doc_link, severity
from attnkit.check.catalogue.__main__ import main
from attnkit.check.catalogue.docs import page
from attnkit.check.catalogue.examples import EXAMPLES

ROOT = Path(__file__).resolve().parents[2]


def test_the_committed_page_is_the_one_the_catalogue_makes():
    committed = (ROOT / "docs" / "check-codes.md").read_text(encoding="utf-8")
    assert committed == page(), "run: python -m attnkit.check.catalogue --write-docs"


def test_every_code_has_a_section_a_wrong_example_and_a_fix():
    text = page()
    assert set(EXAMPLES) == set(CATALOGUE)
    for code, (wrong, fix) in EXAMPLES.items():
        assert f"\n## {code}\n" in text and doc_link(code).endswith(f"#{code}")
        assert wrong in text and fix in text
        assert "assert" in wrong and "assert" in fix and wrong != fix


def test_the_command_writes_the_page(tmp_path, capsys):
    assert main(["--write-docs", str(tmp_path / "codes.md")]) == 0
    assert (tmp_path / "codes.md").read_text(encoding="utf-8") == page()
    assert main([]) == 0 and capsys.readouterr().out.endswith(page())


def test_a_code_is_an_error_or_a_warning_in_each_kind_of_check():
    assert list(CODES) == list(CATALOGUE)
    for code in CATALOGUE:
        assert {severity(code, kind) for kind in KINDS} <= {"error", "warning"}
        assert CODES[code][0] == severity(code, "function")
    # a convention for a lone function, a defect inside a model (its own mask is
    # bottom-right): the one code whose severity depends on the kind of check
    assert [severity("causal-alignment", k) for k in KINDS] == ["warning", "warning", "error"]
    assert severity("fully-masked-row", "model") == "warning"


def test_every_finding_links_to_its_section():
    report = check_softmax(lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True))
    assert report.codes == ["nan-or-inf"]
    assert "see: docs/check-codes.md#nan-or-inf" in report.text()
    assert "参见：docs/check-codes.md#nan-or-inf" in report.text(lang="zh")
