"""中文：复现代码里的注释、打印的文字和断言信息（模型检查的：model/repro.py、
model/any_repro.py；函数检查和多头检查的：core/repro.py、core/cases.py、meet/calls.py、
function/、multihead/）。代码本身在各语言中相同；读者在其中读到的注释、打印内容和断言信息都是
句子，跟随报告的语言。"""

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

# -- 函数检查和多头检查的复现代码（core/repro.py、core/cases.py、meet/calls.py、function/、
# multihead/） ------------------------------------------------------------------------------
TEXTS.update({
    # 输入（core/cases.py）
    "repro.per-query-lens": "每个查询有自己的长度：第 b 行的查询 i 只看 j < valid_lens[b, i] 的键",
    "repro.lens": "只有 j < {lens}[b] 的键参与注意力",
    "repro.may-attend-per-key": "True 表示可以关注，每个键一个值",
    "repro.batch-keeps": "批量中的每一行保留一个键、掩蔽一个键",
    "repro.batch0-no-key": "批量中第 0 行没有可关注的键",
    "repro.every-query": "对每个查询都相同",
    "repro.may-attend": "True 表示可以关注",
    "repro.masked": "True 表示被掩蔽",
    "repro.additive": "加性掩码：0 表示可以关注",
    "repro.row-keeps": "每一行保留一个键、掩蔽一个键",
    "repro.query0-no-key": "查询 0 没有可关注的键",
    "repro.bottom-right": "按右下角对齐的因果掩码",
    "repro.every-score": "每个分数都是 {logit} + O(1)",
    "repro.but-query0": "除查询 0 外都置零：其余各行的分数是 O(1)",
    "repro.row0-near": "第 0 行在 {logit} 附近，其余各行在 0 附近",
    # 调用函数（meet/calls.py、function/）
    "repro.fn-notebook": "你检查的函数，定义在你的笔记本中",
    "repro.fn-named": "{name}：请在这里写上你的函数",
    "repro.fn-here": "请在这里写上你的函数",
    "repro.fn-returns": "fn 返回 (B, Tq, H, Dv)",
    "repro.raises-name": "抛出 {error}",
    "repro.not-array": "fn 返回的是 {type}，不是数组",
    "repro.one-sequence": "one() 只接受一个序列（二维输入）：对批量中的每一行、每个头分别调用它，"
                          "再堆叠起来。",
    "repro.row-of": "带批量轴（和头轴）的输入或掩码：取出其中第 i 个序列",
    # 与参考实现比较（core/repro.py）
    "repro.oracle": "float64 参考实现",
    "repro.oracle-grad": "float64 参考实现的梯度",
    "repro.softmax-backward": "softmax 的反向传播",
    "repro.grad-error": "d{name} 的最大误差：",
    "repro.wrote-into": "fn 改写了它的参数 {changed}",
    "repro.shape": "形状 {got} != {want}",
    "repro.no-allowed-key": "没有可关注键的行",
    "repro.max-error": "与参考实现的最大误差：",
    "repro.small-enough": "数组很小，可以直接看出哪里不同",
    "repro.label-fn": "fn：      ",
    "repro.label-oracle": "参考实现：",
    "repro.error-scale": "按 scale={scale} 计算的误差：",
    "repro.error-inverted": "把掩码取反后的误差：",
    "repro.error-no-causal": "与不加因果掩码的注意力相比的误差：",
    "repro.error-top-left": "与按左上角对齐的因果注意力相比的误差：",
    "repro.two-calls": "两次相同调用之间的最大差异：",
    # 多头注意力模块（multihead/）
    "repro.make-mask": "由 mask (B, Tq, Tk)（True 表示可以关注）构造它所断言的那种掩码",
    "repro.factory-checked": "你检查的类或工厂函数",
    "repro.factory-named": "{name}：你的模块的类或工厂函数",
    "repro.dropout-off": "关闭暂退法，与检查时相同",
    "repro.mask-required": "forward 必须传入掩码：这里传一个什么也不掩蔽的掩码",
    "repro.causal-flag": "模块自带的因果开关：它已声明为因果，所以打开",
    "repro.per-key": "按键给出：对每个查询都相同",
    "repro.nothing-masked": "什么也不掩蔽",
    "repro.wrote-input": "模块改写了它的输入",
    "repro.not-registered": "m.{name} 不是注册过的参数",
    "repro.nan-from-finite": "有限的输入得到了 NaN/inf",
    "repro.keys-masked": "键 {a} 和 {b} 被掩蔽",
    "repro.change-masked": "只改变被掩蔽的键",
    "repro.change-later": "只改变后面的位置",
    "repro.change-last": "只改变最后一个查询",
    "repro.example0-keys": "样本 0 只能关注键 0 和 1",
    "repro.example1-keys": "样本 1 只能关注键 0..3",
    "repro.example0-masks": "样本 0 掩蔽的键",
    "repro.example1-masks": "样本 1 掩蔽的键",
    "repro.as-if-trained": "就像训练过一样",
    "repro.half-non-finite": "{dtype} 下出现了 NaN/inf，而 float32 下是有限值",
    "repro.example0-moved": "只改变了样本 1，样本 0 的输出却变了",
    "repro.mixes-queries": "改变一个查询，其他查询的输出也跟着变了：拆分或合并多头时没有用 "
                           "transpose(1, 2)",
    "repro.core-reads": "模块的注意力核心：即输出投影读到的输入",
    "repro.core-off": "注意力核心的误差为 {err}",
    "repro.core-differs": "在模块自己的投影产生的 q、k、v 上，注意力核心与 "
                          "softmax(q k^T / sqrt(d)) v 不一致",
    "repro.one-value": "同一个值词元，在每个位置上重复",
    "repro.values-from-key": "每个值词元都相同，输出却随 key 改变了：值是从 key 而不是从 "
                             "value 投影得到的",
    "repro.keys-from-value": "key 改变了，输出却没有变：键是从 value 而不是从 key 投影得到的",
    "repro.permuted": "同样的词元，换一个顺序",
    "repro.split-no-transpose": "打乱词元的顺序，输出并没有随之同样打乱：拆分或合并多头时"
                                "没有用 transpose(1, 2)",
})
