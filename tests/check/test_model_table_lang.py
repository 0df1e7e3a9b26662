"""The table by layer of a model check in the report's language: a layer's verdict ("ok",
"not checked"; a code stays a code) and what its empty rows hold ("uniform") are words from
the catalogue, and the columns stay aligned where a Chinese character takes two columns of
the terminal. The English table is as it was, byte for byte."""

from __future__ import annotations

import unicodedata

from attnkit.check.model.report import ImplementationResult, LayerRow, ModelReport

ENGLISH = """\
eager: ran
  layer                              calls  worst error / rule   first failure                      empty rows     verdict
  model.layers.0.self_attn               1  2.0e-07 / 1.0e-05    -                                  4 (uniform)    ok
  model.layers.1.self_attn               2  3.0e-02 / 1.0e-05    step 0, batch 1                    2 (0/other)    inaccurate
  model.layers.2.self_attn               0  -                    -                                  0              not checked"""  # noqa: E501


def _report() -> ModelReport:
    rows = [LayerRow("model.layers.0.self_attn", 1, 2e-7, 1e-5, empty_rows=4,
                     empty_hold=["uniform"]),
            LayerRow("model.layers.1.self_attn", 2, 3e-2, 1e-5, "step 0, batch 1", 2,
                     ["0", "other"], verdict="inaccurate"),
            LayerRow("model.layers.2.self_attn", verdict="not checked")]
    return ModelReport("Tiny", "float32", implementations=[ImplementationResult("eager",
                                                                                 layers=rows)])


def _table(text: str) -> list[str]:
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("eager"))
    return lines[start:start + 5]


def _columns(line: str) -> int:
    return sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line)


def test_the_english_table_is_as_it_was():
    assert "\n".join(_table(_report().text(lang="en"))) == ENGLISH


def test_the_chinese_table_has_its_words_and_its_columns():
    head, *rows = _table(_report().text(lang="zh"))[1:]
    cells = [row.split() for row in rows]
    assert [c[-1] for c in cells] == ["通过", "inaccurate", "未检查"], rows
    assert "4 (均匀)" in rows[0] and "2 (0/其他)" in rows[1], rows
    for line in [head, *rows]:
        assert not any(w in line for w in ("uniform", "other", "ok", "not checked")), line
    # the verdict column starts at the same terminal column in the header and every row
    starts = {_columns(line[:line.index(word)]) for line, word in
              [(head, "结论"), *zip(rows, ["通过", "inaccurate", "未检查"])]}
    assert len(starts) == 1, [head, *rows]
