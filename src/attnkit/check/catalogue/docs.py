"""The reference page of every code, made from the catalogue: what it means, why it
matters, how to fix it (in English and Chinese), its severity in each kind of check, a wrong
example shown failing the check and the fix shown passing it."""

from __future__ import annotations

from . import CATALOGUE, KINDS, code_words
from .examples import EXAMPLES

__all__ = ["PAGE", "page"]

PAGE = "docs/check-codes.md"

_INTRO = """# attnkit check: the codes

<!-- Made by `python -m attnkit.check.catalogue --write-docs` from the catalogue
(src/attnkit/check/catalogue): edit it there; a test fails while this page differs. -->

Every finding of `attnkit check` carries one of these codes; the text report links each
finding to its section here. An **error** is a defect to fix; a **warning** names a
convention that peers disagree on. A block check (`check_block`) judges a module, so its
findings take the multi-head column. Each section ends with a wrong example, shown failing
the check, and its fix, shown passing it: both run in the docs test. The tour of the
checker: [check.md](check.md).

每个发现都带有下面的一个代码；报告里的每个发现都链接到这里对应的一节。

| code | function | multi-head | model | meaning |
|---|---|---|---|---|
"""


def _section(name: str) -> str:
    code = CATALOGUE[name]
    en, zh = code_words(name, "en"), code_words(name, "zh")
    where = ", ".join(f"{kind}: **{code.severity(kind)}**" for kind in KINDS)
    wrong, fix = EXAMPLES[name]
    return "\n".join([
        f"## {name}", "",
        f"{en['title'][:1].upper()}{en['title'][1:]}. Severity: {where}.", "",
        f"**What it means.** {en['what']}", "",
        f"**Why it matters.** {en['why']}", "",
        f"**How to fix it.** {en['fix']}", "",
        f"**中文：{zh['title']}。** {zh['what']}{zh['why']}{zh['fix']}", "",
        "Wrong:", "", "```python", wrong.rstrip(), "```", "",
        "Fixed:", "", "```python", fix.rstrip(), "```", "",
    ])


def page() -> str:
    """The whole page (Markdown), in the catalogue's order of codes."""
    rows = [f"| [`{name}`](#{name}) | {c.function} | {c.multihead} | {c.model} | "
            f"{code_words(name, 'en')['title']} |" for name, c in CATALOGUE.items()]
    return _INTRO + "\n".join(rows) + "\n\n" + "\n".join(_section(n) for n in CATALOGUE)
