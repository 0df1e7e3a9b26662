"""The sentences of the multi-head oracle, as templates with named fields in English and
Chinese (the same keys in both, tested), written to move into the checker's catalogue as
they are. :func:`say` renders one; a field may itself be a rendered sentence.

Chinese terms follow the Chinese edition of d2l: 查询、键、值, 注意力权重, 头, 投影, 缩放.
"""

from __future__ import annotations

from typing import Any

__all__ = ["EN", "ZH", "Said", "in_language", "say"]

EN: dict[str, str] = {
    # -- the structure read, for the report's oracle line -------------------------------
    "oracle.label-separate": "separate q/k/v nn.Linear",
    "oracle.label-separate-dh": "separate q/k/v nn.Linear, columns (d, H)",
    "oracle.label-fused": "fused qkv nn.Linear, chunks in {order} order",
    "oracle.label-interleaved": "fused qkv nn.Linear, per head ({order}) interleaved",
    "oracle.label-q-fused-kv": "q nn.Linear and a fused {order} nn.Linear",
    "oracle.label-cycle": "{label}, query head h on key/value head h % Hkv",
    "oracle.heads": "{H} heads of {d}",
    "oracle.heads-kv": "{H} heads of {d}, {Hkv} key/value heads",
    "oracle.out-bias": "output projection with bias",
    "oracle.out-no-bias": "output projection without bias",
    "oracle.out-none": "no output projection",
    "oracle.out-then": "output projection, then a step after it that is not read (a residual?)",
    "oracle.structure": "{label}, {heads}, {how}",
    "oracle.structure-causal": "{label}, {heads}, {how}, causal",
    "oracle.offset": "{structure}, a constant added after the attention (as a bias on v)",
    "oracle.inner-torch": "torch.nn.MultiheadAttention",
    "oracle.inner-attnkit": "attnkit MultiHeadAttention",
    "oracle.inner-named": "{label} ({name})",
    "oracle.inner-structure": "{label}, {heads}",
    "oracle.inner-alone": "{structure} (compared on the inputs it got; the wrapper around it "
                          "is not read)",
    "oracle.mixing": "the attention core disagrees: the queries' outputs mix",
    # -- why it was not compared ----------------------------------------------------------
    "why.raised": "the module raised on the call that reads its structure ({error})",
    "why.output-shape": "its output is {shape}, not (B, T, E)",
    "why.random": "two identical calls give different outputs (dropout left on?)",
    "why.numpy": "a NumPy module: its weights are not read",
    "why.no-linear": "no nn.Linear runs in forward: projections written with raw parameters "
                     "(x @ W) are not read, only nn.Linear and nn.MultiheadAttention",
    "why.input-changed": "no nn.Linear reads the module's input as it was given (something "
                         "runs on it first: a norm, a positional embedding)",
    "why.layout": "{nq} nn.Linear layer(s) read the query input and {nkv} the key/value "
                  "input, with widths {widths}: not a layout the check reads (separate "
                  "q/k/v, one fused qkv projection, or q and a fused kv)",
    "why.norm": "{cls} ({name}) runs in forward besides the projections (a norm), and the "
                "attention core does not follow from the captured q, k, v without it",
    "why.module": "{cls} ({name}) runs in forward besides the projections (rotary or other "
                  "position embeddings?), and the attention core does not follow from the "
                  "captured q, k, v without it",
    "why.other": "{cls} ({name}) runs in forward besides the projections, and the attention "
                 "core does not follow from the captured q, k, v without it",
    "why.not-dot-product": "the output is not linear in what its projections give as v, as "
                           "dot-product attention's is (additive attention, or values that "
                           "pass through something else): only dot-product attention is "
                           "compared",
    "why.parameters": "parameters outside its nn.Linear layers ({names}) take part in forward, "
                      "and the attention core does not follow from the captured q, k, v "
                      "without them (learned keys, a temperature?): they are not read",
    "why.positions": "the scores depend on the positions (permuting the tokens does not "
                     "permute the outputs): rotary or relative position embeddings, which "
                     "the check does not read",
    "why.causal": "the causal attention core does not follow from the captured q, k, v by "
                  "any reading the check knows, and a causal module's position-dependent "
                  "scores are not probed",
    "why.inner": "{label}: {why}",
    "why.inner-bias-kv": "its add_bias_kv / add_zero_attn are not read",
    "why.inner-softcap": "its softcap / sinks are not read",
    "why.inner-inputs": "it got inputs the check does not read",
    "why.inner-kv": "it got different key and value inputs",
    "why.inner-float-mask": "the float {name} it gets is not read",
    "why.inner-head-mask": "a per-head attn_mask is not read",
    "why.inner-argument": "its {name}= argument is not read",
    "why.inner-lens": "per-query valid_lens are not read",
    "why.inner-causal": "causal={value} is not read",
    # -- findings ---------------------------------------------------------------------------
    "scale.none": "not scaled: the 1/sqrt(d) is missing",
    "scale.sqrt(E)": "scaled by 1/sqrt(E) = {value:.4g}, the model width, instead of "
                     "1/sqrt(d) = {default:.4g}, the head dim",
    "scale.1/d": "scaled by 1/d = {value:.4g} instead of 1/sqrt(d) = {default:.4g}",
    "scale.sqrt(d)": "multiplied by sqrt(d) = {value:.4g} instead of divided by it",
    "scale.E or d": "scaled by {value:.4g}, which is 1/sqrt(E) (the model width) and also "
                    "1/d at this width, instead of 1/sqrt(d) = {default:.4g}",
    "scale.constant": "scaled by {value:.4g} at every head dim (a constant, where 1/sqrt(d) "
                      "changes with the head dim: {default:.4g} here)",
    "scale.fitted": "scaled by {value:.4g} (fitted) instead of 1/sqrt(d) = {default:.4g}",
    "oracle.wrong-scale": "the attention scores are {words}; scaled dot-product attention "
                          "divides q.k by sqrt(d) (found in the attention core, from the q, "
                          "k, v the module's projections produced)",
    "oracle.wrong-scale-measured": "the core fits the oracle with scale {scale:.4g}, not "
                                   "{default:.4g}",
    "oracle.queries-axis": "the softmax runs over the queries axis (dim=-2 of the (..., Tq, "
                           "Tk) scores), not over the keys: each query's weights must sum to "
                           "1 over the keys (softmax(scores, dim=-1))",
    "oracle.queries-axis-measured": "the core fits the oracle with the softmax over the "
                                    "queries",
    "oracle.sigmoid": "the attention weights are sigmoid(scores), which do not sum to 1 over "
                      "the keys: use softmax(scores, dim=-1)",
    "oracle.sigmoid-measured": "the core fits sigmoid weights; a query's weights sum to "
                               "{lo:.3g} to {hi:.3g} over the keys",
    "oracle.heads-count": "the module computes {H2} head(s) of {d2}, not {H} heads of {d}: "
                          "the heads are split or merged wrongly",
    "oracle.heads-count-measured": "the core fits the oracle at {H2} heads",
    "oracle.batch-mixing": "changing one example of the batch changes another example's "
                           "output: the heads are split or merged across the batch (a reshape "
                           "of a fused qkv (B, T, 3E) straight to (3, B, H, T, d), or a view "
                           "without the transpose); split with "
                           "qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4)",
    "oracle.batch-mixing-measured": "example 0's output moved when only example 1's input "
                                    "changed",
    "oracle.unexplained": "the attention core (softmax(q k^T / sqrt(d)) v on the q, k, v the "
                          "module's projections produced) disagrees with the oracle, and no "
                          "reading the check knows explains it (scale, softmax axis, sigmoid, "
                          "head count, q/k/v order)",
    "oracle.no-reading": "no reading fits",
    "oracle.case": "the oracle: the attention core and the output, from the module's own "
                   "weights",
    "oracle.whole": "the attention core agrees with the oracle on the q, k, v the module's "
                    "projections produced, but the output does not agree with the oracle "
                    "from the module's own weights: the error is in the projections or the "
                    "output projection, not in the attention",
    "oracle.inner-disagrees": "{label} disagrees with the oracle on the inputs it got",
    "oracle.inner-batch-first": "{label} has batch_first=False and gets (B, T, E) inputs: it "
                                "reads the batch axis as positions, so the examples of a "
                                "batch attend to each other; build it with batch_first=True "
                                "or pass x.transpose(0, 1)",
    "oracle.inner-wrapper": "{label} agrees with the oracle on the inputs it got, but the "
                            "module's output does not agree with the oracle on the module's "
                            "inputs: the wrapper feeds it (or reads its output) wrongly",
}

ZH: dict[str, str] = {
    "oracle.label-separate": "q/k/v 各一个 nn.Linear",
    "oracle.label-separate-dh": "q/k/v 各一个 nn.Linear，列按 (d, H) 排列",
    "oracle.label-fused": "合并的 qkv nn.Linear，按 {order} 顺序分块",
    "oracle.label-interleaved": "合并的 qkv nn.Linear，每个头内按 ({order}) 交错",
    "oracle.label-q-fused-kv": "q 一个 nn.Linear，{order} 合并为一个 nn.Linear",
    "oracle.label-cycle": "{label}，查询头 h 使用键/值头 h % Hkv",
    "oracle.heads": "{H} 个头，每头 {d} 维",
    "oracle.heads-kv": "{H} 个头，每头 {d} 维，{Hkv} 个键/值头",
    "oracle.out-bias": "输出投影带偏置",
    "oracle.out-no-bias": "输出投影不带偏置",
    "oracle.out-none": "没有输出投影",
    "oracle.out-then": "输出投影之后还有一步未读取（残差连接？）",
    "oracle.structure": "{label}，{heads}，{how}",
    "oracle.structure-causal": "{label}，{heads}，{how}，因果",
    "oracle.offset": "{structure}，注意力之后加了一个常数（相当于值投影的偏置）",
    "oracle.inner-torch": "torch.nn.MultiheadAttention",
    "oracle.inner-attnkit": "attnkit MultiHeadAttention",
    "oracle.inner-named": "{label}（{name}）",
    "oracle.inner-structure": "{label}，{heads}",
    "oracle.inner-alone": "{structure}（在它收到的输入上比较；外面包装的部分未读取）",
    "oracle.mixing": "注意力核心不一致：各查询的输出相互混杂",
    "why.raised": "读取结构的那次调用中模块抛出了异常（{error}）",
    "why.output-shape": "它的输出形状是 {shape}，不是 (B, T, E)",
    "why.random": "两次相同的调用给出不同的输出（暂退法没有关掉？）",
    "why.numpy": "NumPy 模块：不读取它的权重",
    "why.no-linear": "forward 中没有运行任何 nn.Linear：用裸参数写的投影（x @ W）不读取，只读取 "
                     "nn.Linear 和 nn.MultiheadAttention",
    "why.input-changed": "没有 nn.Linear 直接读取模块收到的输入（之前先做了别的：规范化、"
                         "位置编码）",
    "why.layout": "有 {nq} 个 nn.Linear 读取查询输入、{nkv} 个读取键/值输入，宽度为 {widths}："
                  "不是检查能读取的布局（q/k/v 分开、一个合并的 qkv 投影，或 q 加合并的 kv）",
    "why.norm": "forward 中除投影外还运行了 {cls}（{name}，一种规范化），没有它，注意力核心无法"
                "由捕获的 q、k、v 得出",
    "why.module": "forward 中除投影外还运行了 {cls}（{name}，旋转位置编码或其他位置编码？），没有"
                  "它，注意力核心无法由捕获的 q、k、v 得出",
    "why.other": "forward 中除投影外还运行了 {cls}（{name}），没有它，注意力核心无法由捕获的 q、k、"
                 "v 得出",
    "why.not-dot-product": "输出与投影给出的值（v）不成线性关系，而点积注意力的输出应当如此（加"
                           "性注意力，或值还经过了别的处理）：只与点积注意力比较",
    "why.parameters": "nn.Linear 之外的参数（{names}）参与了 forward，没有它们，注意力核心无法"
                      "由捕获的 q、k、v 得出（学习到的键、温度？）：这些参数不读取",
    "why.positions": "注意力分数依赖位置（打乱词元的顺序，输出并不随之同样打乱）：旋转位置编码或相"
                     "对位置编码，检查不读取这些",
    "why.causal": "因果注意力核心无法用检查已知的任何解读由捕获的 q、k、v 得出，而因果模块中依赖"
                  "位置的分数不做探测",
    "why.inner": "{label}：{why}",
    "why.inner-bias-kv": "不读取它的 add_bias_kv / add_zero_attn",
    "why.inner-softcap": "不读取它的 softcap / sinks",
    "why.inner-inputs": "它收到的输入检查无法读取",
    "why.inner-kv": "它收到的键和值输入不同",
    "why.inner-float-mask": "不读取它收到的浮点 {name}",
    "why.inner-head-mask": "不读取每个头各自的 attn_mask",
    "why.inner-argument": "不读取它的 {name}= 参数",
    "why.inner-lens": "不读取逐查询的 valid_lens",
    "why.inner-causal": "不读取 causal={value}",
    "scale.none": "没有缩放：缺少 1/sqrt(d)",
    "scale.sqrt(E)": "乘的是 1/sqrt(E) = {value:.4g}（E 是模型宽度），而不是 1/sqrt(d) = "
                     "{default:.4g}（d 是每个头的维度）",
    "scale.1/d": "乘的是 1/d = {value:.4g}，而不是 1/sqrt(d) = {default:.4g}",
    "scale.sqrt(d)": "乘了 sqrt(d) = {value:.4g}，本该除以它",
    "scale.E or d": "乘的是 {value:.4g}，在这个宽度下它既等于 1/sqrt(E)（模型宽度）也等于 1/d，"
                    "而不是 1/sqrt(d) = {default:.4g}",
    "scale.constant": "在每种头维度下都乘 {value:.4g}（一个常数；而 1/sqrt(d) 随头维度变化，"
                      "这里是 {default:.4g}）",
    "scale.fitted": "乘的是 {value:.4g}（拟合得到），而不是 1/sqrt(d) = {default:.4g}",
    "oracle.wrong-scale": "注意力分数{words}；缩放点积注意力把 q·k 除以 sqrt(d)（在注意力核心中"
                          "发现：用的是模块自己的投影算出的 q、k、v）",
    "oracle.wrong-scale-measured": "注意力核心在缩放 {scale:.4g}（而不是 {default:.4g}）下与参考"
                                   "实现一致",
    "oracle.queries-axis": "softmax 沿查询轴（(..., Tq, Tk) 分数的 dim=-2）计算，而不是沿键：每个"
                           "查询的注意力权重在所有键上之和必须为 1（softmax(scores, dim=-1)）",
    "oracle.queries-axis-measured": "注意力核心与沿查询轴做 softmax 的参考实现一致",
    "oracle.sigmoid": "注意力权重是 sigmoid(scores)，在所有键上之和不为 1：请用 "
                      "softmax(scores, dim=-1)",
    "oracle.sigmoid-measured": "注意力核心与 sigmoid 权重一致；一个查询的权重在所有键上之和为 "
                               "{lo:.3g} 到 {hi:.3g}",
    "oracle.heads-count": "模块算的是 {H2} 个头、每头 {d2} 维，而不是 {H} 个头、每头 {d} 维：拆分"
                          "或合并多个头的方式不对",
    "oracle.heads-count-measured": "注意力核心与 {H2} 个头的参考实现一致",
    "oracle.batch-mixing": "改变批量中的一个样本，另一个样本的输出也变了：多个头的拆分或合并跨越了"
                           "批量（把合并的 qkv (B, T, 3E) 直接 reshape 成 (3, B, H, T, d)，或 "
                           "view 之后没有 transpose）；请用 "
                           "qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4) 拆分",
    "oracle.batch-mixing-measured": "只改变样本 1 的输入，样本 0 的输出就变了",
    "oracle.unexplained": "注意力核心（在模块自己的投影算出的 q、k、v 上计算 "
                          "softmax(q k^T / sqrt(d)) v）与参考实现不一致，检查已知的解读（缩放、"
                          "softmax 的轴、sigmoid、头数、q/k/v 的顺序）都解释不了",
    "oracle.no-reading": "没有一种解读吻合",
    "oracle.case": "参考实现：用模块自己的权重比较注意力核心和输出",
    "oracle.whole": "在模块自己的投影算出的 q、k、v 上，注意力核心与参考实现一致，但用模块自己的"
                    "权重算出的输出不一致：错误在投影或输出投影中，不在注意力本身",
    "oracle.inner-disagrees": "{label} 在它收到的输入上与参考实现不一致",
    "oracle.inner-batch-first": "{label} 的 batch_first=False，却收到 (B, T, E) 的输入：它把批量"
                                "轴当成位置轴，于是同一批量中的样本相互关注；请用 "
                                "batch_first=True 构造它，或传入 x.transpose(0, 1)",
    "oracle.inner-wrapper": "{label} 在它收到的输入上与参考实现一致，但模块在自己的输入上的输出"
                            "不一致：外层包装给它的输入（或读取它的输出）有误",
}


class Said(str):
    """A sentence of :data:`EN` with its key and fields; as a ``str``, its English."""

    key: str
    fields: dict[str, Any]

    def __new__(cls, key: str, fields: dict[str, Any]) -> Said:
        obj = super().__new__(cls, EN[key].format(**fields))
        obj.key, obj.fields = key, fields
        return obj

    def __reduce__(self) -> tuple:  # copies (dataclasses.asdict) keep the key
        return (Said, (self.key, self.fields))

    def render(self, lang: str) -> str:
        """This sentence in ``lang`` (:func:`in_language`)."""
        return in_language(self, lang)


def say(key: str, **fields: Any) -> Said:
    """The sentence ``key`` with ``fields``: English as a ``str``, any language with
    :func:`in_language`."""
    return Said(key, fields)


def in_language(text: Any, lang: str) -> str:
    """``text`` in ``lang`` when it is a :class:`Said` (its fields too), else as it is."""
    if not isinstance(text, Said) or lang == "en":
        return str(text)
    fields = {k: in_language(v, lang) if isinstance(v, Said) else v
              for k, v in text.fields.items()}
    return {"zh": ZH}[lang][text.key].format(**fields)
