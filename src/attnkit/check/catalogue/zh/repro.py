"""中文：模型检查的复现代码里的注释和打印的文字（model/repro.py、model/any_repro.py）。
代码本身在各语言中相同；读者在其中读到的注释、打印内容和断言信息都是句子，跟随报告的语言。"""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "sep.line": "\n",
    "repro.stand-in": "fn 从调用它的模块上读取的属性",
    "repro.module-state": "模块的设置和它自己的张量（如 sinks）",
    "repro.raises-half": "在半精度下报错",
    "repro.raises": "报错（{error}）",
    "repro.oracle-received": "float64 参考实现，输入与 fn 收到的相同",
    "repro.row-error": "这一行与参考实现的最大误差：",
    "repro.register-first": "请先注册你的函数",
    "repro.as-ran": "与模型运行时的注册相同",
    "repro.pair": "批量中第 {batch} 行，查询 i，键 j",
    "repro.pair-head": "批量中第 {batch} 行，第 {head} 个头，查询 i，键 j",
    "repro.received-allows": "这次调用收到的掩码是否允许",
    "repro.expected-allows": "按配置和填充应当是否允许",
    "repro.may-see": "查询 i 能否看到键 j：收到的掩码",
    "repro.expected": "| 应为",
    "repro.quoted": "{text!r}",
    "repro.define-here": "{name}：被检查的实现（没有文件定义它，请在这里定义）",
    "repro.under-test": "被检查的实现",
    "repro.output-shape": "输出形状",
    "repro.build-yours": "请像模型中那样构建你的 {name}",
    "repro.own-settings": "它自己的设置，与模型中相同",
    "repro.from-weights": "float64，用模块自己的权重计算",
    "repro.flex-code": "该层的 score_mod 和 block_mask 是你代码中的函数（{layer}）：",
    "repro.flex-off": "批量 {batch}、头 {head}、查询 {query} 这一行的误差超过 {bound}",
}
