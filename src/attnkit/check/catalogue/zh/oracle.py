"""Chinese: the sentences of the multi-head oracle (multihead/oracle.py)."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "oracle.label-separate": "q/k/v 各一个 nn.Linear",
    "oracle.label-separate-dh": "q/k/v 各一个 nn.Linear，列按 (d, H) 排列",
    "oracle.label-fused": "合并的 qkv nn.Linear，按 {order} 顺序分块",
    "oracle.label-interleaved": "合并的 qkv nn.Linear，每个头内按 ({order}) 交错",
    "oracle.label-q-fused-kv": "q 一个 nn.Linear，{order} 合并为一个 nn.Linear",
    "oracle.label-cycle": "{label}，查询头 h 使用键/值头 h % Hkv",
    "oracle.heads": "{H} 个头，每头 {d} 维",
    "oracle.heads-kv": "{H} 个头，每头 {d} 维，{Hkv} 个键/值头",
    "oracle.heads-1": "1 个头，{d} 维",
    "oracle.heads-kv-1": "{H} 个头，每头 {d} 维，1 个键/值头",
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
    "oracle.why-raised": "读取结构的那次调用中模块抛出了异常（{error}）",
    "oracle.why-output-shape": "它的输出形状是 {shape}，不是 (B, T, E)",
    "oracle.why-random": "两次相同的调用给出不同的输出（暂退法没有关掉？）",
    "oracle.why-numpy": "NumPy 模块：不读取它的权重",
    "oracle.why-not-reached": "检查在比较之前就停止了（见各项发现）",
    "oracle.why-no-linear": (
        "forward 中没有运行任何 nn.Linear：用裸参数写的投影（x @ W）不读取，只读取 nn.Linear "
        "和 nn.MultiheadAttention"
    ),
    "oracle.why-input-changed": (
        "没有 nn.Linear 直接读取模块收到的输入（之前先做了别的：规范化、位置编码）"
    ),
    "oracle.why-layout": (
        "有 {nq} 个 nn.Linear 读取查询输入、{nkv} 个读取键/值输入，宽度为 {widths}：不是检查"
        "能读取的布局（q/k/v 分开、一个合并的 qkv 投影，或 q 加合并的 kv）"
    ),
    "oracle.why-norm": (
        "forward 中除投影外还运行了 {cls}（{name}，一种规范化），没有它，注意力核心无法由捕获"
        "的 q、k、v 得出"
    ),
    "oracle.why-module": (
        "forward 中除投影外还运行了 {cls}（{name}，旋转位置编码或其他位置编码？），没有它，注"
        "意力核心无法由捕获的 q、k、v 得出"
    ),
    "oracle.why-other": (
        "forward 中除投影外还运行了 {cls}（{name}），没有它，注意力核心无法由捕获的 q、k、v "
        "得出"
    ),
    "oracle.why-not-dot-product": (
        "输出与投影给出的值（v）不成线性关系，而点积注意力的输出应当如此（加性注意力，或值还"
        "经过了别的处理）：只与点积注意力比较"
    ),
    "oracle.why-parameters": (
        "nn.Linear 之外的参数（{names}）参与了 forward，没有它们，注意力核心无法由捕获的 q、k"
        "、v 得出（学习到的键、温度？）：这些参数不读取"
    ),
    "oracle.why-positions": (
        "输出依赖位置（打乱词元的顺序，输出并不随之同样打乱）：旋转位置编码或相对位置编码，"
        "或由位置构造的掩码（窗口），检查不读取这些；也可能是拆分多头时用了 "
        "view(B, H, T, d) 而没有 transpose，把词元混在了一起"
    ),
    "oracle.why-causal": (
        "因果注意力核心无法用检查已知的任何解读由捕获的 q、k、v 得出，而因果模块中依赖位置的"
        "分数不做探测"
    ),
    "oracle.why-inner": "{label}：{why}",
    "oracle.why-inner-bias-kv": "不读取它的 add_bias_kv / add_zero_attn",
    "oracle.why-inner-softcap": "不读取它的 softcap 或 sinks",
    "oracle.why-inner-inputs": "它收到的输入检查无法读取",
    "oracle.why-inner-kv": "它收到的键和值输入不同",
    "oracle.why-inner-float-mask": "不读取它收到的浮点 {name}",
    "oracle.why-inner-head-mask": "不读取每个头各自的 attn_mask",
    "oracle.why-inner-argument": "不读取它的 {name}= 参数",
    "oracle.why-inner-lens": "不读取逐查询的 valid_lens",
    "oracle.why-inner-causal": "不读取 causal={value}",
    "oracle.scale-none": "没有缩放：缺少 1/sqrt(Dk)",
    "oracle.scale-sqrt(E)": (
        "乘的是 1/sqrt(E) = {value:.4g}（E 是模型宽度），而不是 1/sqrt(Dk) = {default:.4g}（Dk "
        "是每个头的维度）"
    ),
    "oracle.scale-1/d": "乘的是 1/Dk = {value:.4g}，而不是 1/sqrt(Dk) = {default:.4g}",
    "oracle.scale-sqrt(d)": "乘了 sqrt(Dk) = {value:.4g}，本该除以它",
    "oracle.scale-E or d": (
        "乘的是 {value:.4g}，在这个宽度下它既等于 1/sqrt(E)（模型宽度）也等于 1/Dk，"
        "而不是 1/sqrt(Dk) = {default:.4g}"
    ),
    "oracle.scale-constant": (
        "在每种头维度下都乘 {value:.4g}（一个常数；而 1/sqrt(Dk) 随头维度变化，这里是 {default"
        ":.4g}）"
    ),
    "oracle.scale-fitted": "乘的是 {value:.4g}（拟合得到），而不是 1/sqrt(Dk) = {default:.4g}",
    "oracle.wrong-scale": (
        "注意力分数{words}；缩放点积注意力把 q·k 除以 sqrt(Dk)（在注意力核心中发现：用的是模块"
        "自己的投影算出的 q、k、v）"
    ),
    "oracle.wrong-scale-measured": (
        "注意力核心在缩放 {scale:.4g}（而不是 {default:.4g}）下与参考实现一致"
    ),
    "oracle.diagonal-masked": (
        "因果掩码把对角线也掩蔽了：每个查询只看到更早的键，看不到它自己（掩码用了 "
        "triu(ones, diagonal=0)，或保留矩阵用了 tril(ones, diagonal=-1)）；只应掩蔽后面的键："
        "掩码用 triu(ones, diagonal=1)，保留矩阵用 tril(ones)"
    ),
    "oracle.diagonal-masked-measured": (
        "第 1 个及以后的查询与掩蔽对角线的参考实现一致（第 0 个查询因此没有可关注的键）"
    ),
    "oracle.tokens-alone": (
        "每个词元的输出都不读取其他词元：注意力是在多个头之间算的，而不是在词元之间（q、k、v "
        "被看作 (B, T, H, Dk) 却没有 transpose(1, 2)，分数成了 (B, T, H, H)）；拆分多头应写作 "
        ".view(B, T, H, Dk).transpose(1, 2)"
    ),
    "oracle.tokens-alone-measured": "改变第 0 个词元，其他词元的输出都不变",
    "oracle.queries-axis": (
        "softmax 沿查询轴（(..., Tq, Tk) 分数的 dim=-2）计算，而不是沿键：每个查询的注意力权"
        "重在所有键上之和必须为 1（softmax(scores, dim=-1)）"
    ),
    "oracle.queries-axis-measured": "注意力核心与沿查询轴做 softmax 的参考实现一致",
    "oracle.sigmoid": (
        "注意力权重是 sigmoid(scores)，在所有键上之和不为 1：请用 softmax(scores, dim=-1)"
    ),
    "oracle.sigmoid-measured": (
        "注意力核心与 sigmoid 权重一致；一个查询的权重在所有键上之和为 {lo:.3g} 到 {hi:.3g}"
    ),
    "oracle.heads-count": (
        "模块算的是 {H2} 个头、每头 {d2} 维，而不是 {H} 个头、每头 {d} 维：拆分或合并多个头的"
        "方式不对"
    ),
    "oracle.heads-count-measured": "注意力核心与 {H2} 个头的参考实现一致",
    "oracle.merge-no-transpose": (
        "合并多个头时少了转置：注意力输出 (B, H, T, Dk) 被直接 reshape 成 (B, T, E)，每个词元的"
        "那一行混进了其他词元的片段（靠后的词元也就影响了靠前的词元）；请用 "
        "out.transpose(1, 2).reshape(B, T, E) 合并"
    ),
    "oracle.merge-no-transpose-measured": (
        "输出投影收到的输入，等于参考实现的注意力核心 (B, H, T, Dk) 不经转置直接按 (B, T, E) 读出"
    ),
    "oracle.batch-mixing": (
        "改变批量中的一个样本，另一个样本的输出也变了：多个头的拆分或合并跨越了批量（把合并的"
        " qkv (B, T, 3E) 直接 reshape 成 (3, B, H, T, d)，或 view 之后没有 transpose）；请用 "
        "qkv.view(B, T, 3, H, d).permute(2, 0, 3, 1, 4) 拆分"
    ),
    "oracle.batch-mixing-measured": "只改变样本 1 的输入，样本 0 的输出就变了",
    "oracle.unexplained": (
        "注意力核心（在模块自己的投影算出的 q、k、v 上计算 softmax(q k^T / sqrt(Dk)) v）与参考"
        "实现不一致，检查已知的解读（缩放、softmax 的轴、sigmoid、头数、q/k/v 的顺序）都解释"
        "不了"
    ),
    "oracle.no-reading": "没有一种解读吻合",
    "oracle.case": "参考实现：用模块自己的权重比较注意力核心和输出",
    "oracle.whole": (
        "在模块自己的投影算出的 q、k、v 上，注意力核心与参考实现一致，但用模块自己的权重算出"
        "的输出不一致：错误在投影或输出投影中，不在注意力本身"
    ),
    "oracle.inner-disagrees": "{label} 在它收到的输入上与参考实现不一致",
    "oracle.inner-batch-first": (
        "{label} 的 batch_first=False，却收到 (B, T, E) 的输入：它把批量轴当成位置轴，于是同"
        "一批量中的样本相互关注；请用 batch_first=True 构造它，或传入 x.transpose(0, 1)"
    ),
    "oracle.inner-wrapper": (
        "{label} 在它收到的输入上与参考实现一致，但模块在自己的输入上的输出不一致：外层包装给"
        "它的输入（或读取它的输出）有误"
    ),
    "report.oracle-compared": "已用模块自己的权重与 float64 参考实现比较：{structure}",
    "report.oracle-not-compared": "未与参考实现比较：{why}",
    "report.no-findings-not-compared": "只做了性质检查，没有发现问题（未与参考实现比较，原因见上）",
    "oracle.value-from-key": (
        "值是从键输入投影得到的（self.{v} 读的是 key）：value 从未被读取，只要 value 与 key "
        "不同，输出就是错的；请从 value 投影出 v（self.{v}(value)）"
    ),
    "oracle.key-from-value": (
        "键是从值输入投影得到的（self.{k} 读的是 value）：key 从未被读取；请从 key 投影出 k"
        "（self.{k}(key)）"
    ),
    "oracle.key-value-swapped": (
        "键和值弄反了：键从值输入投影得到（self.{k} 读的是 value），值从键输入投影得到"
        "（self.{v} 读的是 key）；请从 key 投影出 k，从 value 投影出 v"
    ),
    "oracle.split-no-transpose": (
        "拆分多个头时少了转置：view(B, H, T, Dk) 把投影的输出 (B, T, E) 直接读成多个头，每个头"
        "的各行混进了多个词元的片段，注意力也就把词元混在了一起；请用 "
        ".view(B, T, H, Dk).transpose(1, 2) 拆分"
    ),
    "oracle.split-no-transpose-measured": (
        "把投影的输出不经转置直接按 (B, H, T, Dk) 读作 q、k、v 时，注意力核心与参考实现一致"
    ),
    "oracle.inner-value-from-key": (
        "{label} 收到的值是键输入：value 从未被读取，只要 value 与 key 不同，输出就是错的；"
        "请传入 (query, key, value)"
    ),
    "oracle.inner-key-from-value": (
        "{label} 收到的键是值输入：key 从未被读取；请传入 (query, key, value)"
    ),
    "oracle.inner-key-value-swapped": (
        "{label} 收到的键和值弄反了，成了 (query, value, key)；请传入 (query, key, value)"
    ),
}
