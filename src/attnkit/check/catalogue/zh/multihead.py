"""中文: the sentences of the multi-head checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- 多头注意力的探测（multihead/） --------------------------------------------------------
TEXTS.update({
    "mha.mask-ignored": "被掩蔽的键上的值改变了输出：掩码被忽略了，或者用错了地方",
    "mha.mask-on-queries": "掩码加在了查询轴上：被掩蔽位置自己的输出被清空，而每个查询仍然关注"
                           "被掩蔽的键；逐键的掩码 (B, Tk) 应当加在分数的最后一个轴上，"
                           "即 mask[:, None, None, :]",
    "mha.polarity": "模块按与“{convention}”约定相反的含义读取掩码：它关注的恰好是掩码排除的"
                    "那些键",
    "measured.max-change": "最大变化 {value:.3g}",
    "mha.empty-row-nan": "没有可关注键的查询得到了 NaN：请单独处理这样的行，让它输出 0",
    "measured.nan-empty-row": "整行被掩蔽的那一行上出现 NaN",
    "mha.uniform-additive": "加性的 finfo.min 掩码留下均匀的一行，transformers 的 eager 注意力"
                            "也是这样",
    "mha.uniform-fill": "{fill}，留下了均匀的一行",
    "mha.empty-row-averages": "没有可关注键的查询仍在对所有值求平均（{why}）；attnkit、SDPA 和 "
                              "flash-attn 的注意力输出为 0",
    "measured.moves-with-values": "它的输出随值的改变而改变",
    "mha.causal-leak": "声明了因果注意力，模块却让位置 i 看到了之后的位置：改动 x 在位置 3 和 4 "
                       "上的值，位置 0..2 的输出就变了（请在 softmax 之前加上因果掩码，例如 "
                       "scores.masked_fill(~torch.tril(...), -inf)）",
    "measured.early-moved": "位置 0..2 的输出变了",
    "mha.mixes-queries-lengths": "只改动查询 {query}，查询 {moved} 的输出也变了，而且查询和键长度"
                                 "不同时模块会报错：查询长度和键长度被混淆了，分数不是在键上"
                                 "归一化的 (B, Tq, Tk)；请找出把它们对调的那个 unsqueeze、"
                                 "transpose、view 或 reshape",
    "mha.mixes-queries": "只改动查询 {query}，查询 {moved} 的输出也变了：每个查询的输出只应取决"
                         "于它自己和键、值。拆分或合并多个头的方式让词元混在了一起：拆分应写 "
                         "x.view(B, T, H, Dk).transpose(1, 2)，而不是 x.view(B, H, T, Dk)；"
                         "合并应写 out.transpose(1, 2).contiguous().view(B, T, E)，而不是 "
                         "out.view(B, T, E)",
    "measured.queries-moved": "查询 {moved} 的输出变了，最大变化 {value:.3g}",
})
TEXTS.update({
    "mha.no-gradient": "已注册的参数 {names} 始终得不到梯度：它们没有参与输出的计算（没有用上，"
                       "或者被 detach 了），永远不会被训练",
    "measured.grad-none-count": "{n} 个参数的 grad 为 None",
    "mha.grad-non-finite": "对有限的输入，梯度里出现了 NaN/inf",
    "measured.grad-non-finite": "梯度不是有限值",
    "mha.grad-differences": "模块的梯度与它自身前向计算的中心差分（float64）不一致：手写的反向"
                            "传播有错",
    "measured.directional": "方向导数：自动微分得 {analytic:.6g}，中心差分得 {numeric:.6g}"
                            "（相对误差 {rel:.2e} > 1e-2）",
    "mha.state-dict-load": "新建的模块载入不了这个模块的 state_dict（{error}）",
    "mha.state-dict": "新建的模块载入这个模块的 state_dict 之后，输出不同",
    "mha.state-dict-plain": "新建的模块载入这个模块的 state_dict 之后，输出不同：作为普通属性"
                            "保存的张量（{names}）没有被保存；请用 register_buffer 注册它们"
                            "（.to() 和 .half() 也看不到它们）",
    "measured.max-difference": "最大差异 {value:.3g}",
    "mha.dropout-in-eval": "调用 eval() 之后，模块仍在随机丢弃注意力权重：请把 "
                           "training=self.training 传给 F.dropout（或使用 nn.Dropout 子模块）",
    "mha.nondeterministic": "同样的两次调用输出不同：暂退法还开着：请把 dropout 设为 0，或只在"
                            "训练时抽取随机数（暂退法、每次调用时抽取的权重）",
    "measured.eval-differ": "两次 eval() 调用相差 {value:.3g}",
    "measured.nan-in-output": "输出中有 NaN/inf",
    "mha.half": "模块在 {dtype} 下出错，而 float32 下正常（{problem}）；{cause}",
})
TEXTS.update({
    "mha.mutates": "模块原地写入了它的输入 {name}：调用者的张量被改掉了",
    "try.output-shape-only": "{label}：输出形状为 {shape}",
    "mha.call-words": "在 {layout} 的输入上调用 {call}",
    "mha.unregistered": "{holder} 保存的张量没有注册到模块（{n} 个，例如 {first}）："
                        ".parameters()（因而优化器）、.to()/.half() 和 state_dict() 都看不到"
                        "它们；请把模块放进 nn.ModuleList/nn.ModuleDict，张量放进 "
                        "nn.Parameter/nn.ParameterList",
    "measured.unregistered": "{n} 个没有注册：{names}",
    "mha.raises-on-lengths": "查询和键一样长（Tq = Tk）时模块能运行，在查询 {query}、键/值 {kv} "
                             "上却报错：{error} 代码在该用键长度的地方用了查询长度（或反过来）："
                             "分数应为 (B, Tq, Tk)；请找出混淆这两个长度的那个 unsqueeze、"
                             "transpose、view 或 reshape",
    "mha.raises-on": "模块在查询 {query}、键/值 {kv} 上报错：{error}",
    "mha.not-callable-as": "没能{call}：{error}；请用 --convention 声明掩码，或把模块包进一个"
                           "工厂函数，让它的 forward 接受 (query, key, value) 或 (x)",
    "mha.output-shape": "输出形状为 {shape}，应为 {want}（查询长度 Tq = {Tq}，键长度 {Tk}）",
    "mha.no-max-trick": "分数达到 1e3~1e4 时，模块对有限的输入给出了 NaN/inf：softmax 没有先"
                        "减去最大值，exp() 上溢；请先减去每行的最大值"
                        "（torch.softmax 就是这样做的）",
    "measured.non-finite-at": "输入乘以 {scale} 时，{size} 个输出中有 {n} 个不是有限值",
})
TEXTS.update({
    "mha.no-mask-layout": "模块的 {name}= 不接受检查器知道的任何一种掩码布局（第一种：{first}），"
                          "因此没有测试掩码；请用 --convention 声明掩码，或写出它需要的工厂函数"
                          "再检查：`{factory}`",
    "measured.tried-layouts": "尝试过：{tries}",
    "mha.raised": "{what}时报错 {error}；{fix}",
    "mha.building": "构造模块{tried}",
    "mha.fix-factory": "如果参数不适合它，请写一个工厂函数：def make(E, H): return "
                       "YourClass(...)，然后检查 file.py:make",
    "mha.gives-not-callable": "{how} 得到的是一个 {type}，不能调用：请传入类、实例，或返回模块的"
                              "工厂函数",
    "mha.calling": "在 {shape} 的输入上按 {call} 调用模块",
    "mha.calling-mask": "在 {shape} 的输入上按 {call} 调用模块（掩码作为 {name}= 传入）",
    "mha.fix-call": "请确认 forward 按位置或按 query/key/value 这些名字接受输入；用 "
                    "--convention 声明掩码（如果 forward 多出来的参数不是掩码，就声明 none），"
                    "或写一个包装该模块的工厂函数",
    "mha.calling-with-mask": "带掩码调用模块",
    "mha.fix-mask": "请用 --convention 声明它如何读取掩码（如果它不接受注意力掩码，就声明 none）",
    "how.no-layout": "{name}= 不接受任何已知的布局：未测试掩码",
    "mha.convention-choices": "约定只能是 auto、valid_lens、masked、keep、additive、none 之一，"
                              "得到的是 {got}",
    "mha.no-mask-to-declare": "--convention {conv}：模块的 forward 没有掩码参数（没有名为 "
                              "mask、attn_mask、valid_lens 等的参数）",
    "header.self-attention": "，自注意力 m(x)",
    "header.by-name": "，按参数名传入 {names}",
    "header.found-by-trying": "（试出来的）",
    "header.none-mixing": "none（未测试掩码：各查询的输出相互串扰）",
    "header.behaves-causal": "表现为因果：靠后的位置不改变靠前位置的输出",
    "header.bidirectional": "双向：靠后的位置会改变靠前位置的输出",
    "header.declared": "（已声明为因果）",
    "header.flag-set": "，每次调用都传入 {name}=True",
    "probe.registration": "注册：每个需要训练的张量都是已注册的参数",
    "probe.mask-layouts": "掩码：尝试过的掩码布局",
    "probe.causality": "因果性：改动位置 3、4 会不会改变位置 0..2 的输出？",
    "probe.shapes-self": "形状：Tq == Tk",
    "probe.shapes": "形状：Tq == Tk、Tq < Tk、Tq > Tk",
    "probe.queries": "查询相互独立：改动查询 4 会不会改变 0..3 的输出？",
    "probe.logits": "logits 约为 1e3 和 1e4（输入乘以 30 和 100）",
    "probe.masks-mixing": "掩码：未测试，各查询的输出相互串扰（mixes-queries）",
    "probe.masks": "被掩蔽的键不改变任何输出；没有可关注键的查询",
    "probe.same-call": "同样的调用两次，输出相同",
    "probe.state-dict": "把 state_dict 载入新建的模块",
    "probe.half": "模块的 {dtype} 副本",
    "probe.gradients": "梯度：每个参数都有梯度；float64 中心差分",
    "probe.dropout": "eval()：暂退法关闭（模块有 dropout 的地方设为 0.5）",
})
TEXTS.update({
    "mha.raised-at": "{what}时报错 {error}（{where}）；{fix}",
    "mha.building-as": "按 {expr} 构造模块",
    "mha.fix-factory-written": "如果参数不适合它，请写出它需要的工厂函数再检查："
                               "`def make(E, H): return {factory}`，然后运行 "
                               "`attnkit check multi-head {file}:make`",
    "mha.per-example": "每个样本用不同的掩码时，某个样本掩蔽的键上的值改变了它的输出：掩码与样本"
                       "配错了（掩码在头上重复的顺序与分数的批量和头的顺序不同：请用 "
                       "repeat_interleave，或在合并 B 和 H 之前扩展成 (B, H, Tq, Tk)）",
    "measured.max-change-01": "查询 0 和 1 上的最大变化 {value:.3g}",
    "probe.per-example": "每个样本各自的掩码：样本 0 关注键 0..1，样本 1 关注键 0..3",
    "try.seq-first": "{layout}，输入为 (T, B, E)",
    "try.raised-at": "{label}：{error}（{where}）",
    "where.line": "第 {n} 行：{code}",
})
