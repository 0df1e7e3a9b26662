"""中文：每个代码的说明和报告里的每一句话（带命名字段的模板，``str.format``），与
:mod:`.en` 的键一一对应（有测试）。术语依照《动手学深度学习》中文版：查询、键、值，注意力汇聚，
掩蔽softmax，有效长度，缩放点积注意力，多头注意力，暂退法（dropout）。"""

from __future__ import annotations

from .anymodel import TEXTS as _ANYMODEL
from .behaviour import TEXTS as _BEHAVIOUR
from .block import TEXTS as _BLOCK
from .checks import TEXTS as _CHECKS
from .cli import TEXTS as _CLI
from .codes import CODES
from .model import TEXTS as _MODEL
from .multihead import TEXTS as _MULTIHEAD
from .oracle import TEXTS as _ORACLE
from .repro import TEXTS as _REPRO

__all__ = ["CODES", "STYLE", "TEXTS"]

STYLE = "blocks"

TEXTS: dict[str, str] = {**_CHECKS, **_BEHAVIOUR, **_MULTIHEAD, **_ORACLE, **_BLOCK, **_MODEL,
                          **_ANYMODEL, **_REPRO, **_CLI}
