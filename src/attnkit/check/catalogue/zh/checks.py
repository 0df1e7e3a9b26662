"""中文: the sentences of a report and of the function checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {
    # -- 报告的框架 -------------------------------------------------------------------------
    "sep.list": "、",
    "sep.clauses": "；",
    "sep.fields": "，",
    "error": "错误",
    "warning": "警告",
    "report.title": "attnkit 检查 {check}：{target}",
    "report.framework": "框架 {value}",
    "report.convention": "约定 {value}",
    "report.layout": "布局 {value}",
    "report.not-found": "未识别",
    "report.causality": "因果性：{value}",
    "report.cases": "共 {n} 个用例，用时 {seconds:.2f} 秒",
    "report.untested": "没有识别出掩码参数，因此没有测试掩码、整行被掩蔽和因果对齐"
                       "（可用 --convention valid_lens、masked、keep、sdpa 或 additive 声明）",
    "report.untested-causal": "没有识别出掩码参数，因此没有测试掩码和整行被掩蔽的情况（可用 "
                              "--convention valid_lens、masked、keep、sdpa 或 additive 声明）",
    "report.no-findings": "没有发现问题：每个用例都与参考实现一致",
    "report.severity": "严重程度",
    "report.code": "代码",
    "report.diagnosis": "诊断",
    "report.detail": "详情",
    "report.measured": "实测",
    "report.case": "用例",
    "report.see": "参见",
    "report.reproducer": "复现 {code} 的代码：",
    "report.verdict": "{verdict}：{errors} 个错误，{warnings} 个警告",
    "report.ok": "通过",
    "report.failed": "未通过",
}

# -- 实测：与 2 倍/3 倍/5 倍规则的比较（core/oracle.py） ------------------------------------
TEXTS.update({
    "report.stopped": "运行 {running} 时检查中断：{error}",
    "measured.raised": "{name}",
    "measured.rule-shape": "{name}：形状 {shape} 与参考形状 {want} 不同",
    "measured.rule-nan": "{name}：{n} 个值为 NaN，参考实现在这些位置上没有 NaN",
    "measured.rule-finite": "{name}：{n} 个值是有限值，参考实现在这些位置上是 NaN"
                            "（被关注位置上的 NaN 应当传播下去）",
    "measured.rule-inf": "{name}：{n} 个 inf 与参考实现不同",
    "measured.rule": "{name}：最大误差 {err:.3e}（平均 {mean:.3e}）超过了 {factor} × "
                     "基线误差 {base:.3e}（平均 {base_mean:.3e}）+ {atol:g} = {bound:.3e}",
})
TEXTS.update({
    "measured.name-output": "输出",
    "measured.name-softmax": "softmax",
    "measured.name-weights": "注意力权重",
    "measured.name-attention-core": "注意力核心",
    "measured.name-inner-attention": "模块内部的注意力层",
    "report.running-fn": "fn",
    "report.running-module": "模块",
})

# -- 逐个用例判定函数（core/judge.py） ----------------------------------------------------
TEXTS.update({
    "judge.mutates": "fn 原地写入了它的参数 {name}（mul_、masked_fill_ 或 x[...] = ... 这类"
                     "原地（in-place）操作）：调用者的 {name} 被改掉了；"
                     "请先复制一份（copy），或改用非原地（out-of-place）版本",
    "measured.differs-after": "调用之后 {name} 变了",
    "judge.half-raises": "fn 在 {dtype} 下报错，在 float32 下不报错（{error}）；{cause}",
    "judge.raises-on": "fn 在 {case} 上报错（{error}）",
    "judge.not-an-array": "fn 返回了 {type}，既不是数组也不是 (out, weights)：{error}",
    "judge.output-shape": "输出形状为 {shape}，在 {case} 上应为 {want}",
    "measured.shape": "形状 {shape} != {want}",
    "measured.non-finite": "输出的 {size} 个值中有 {n} 个不是有限值",
    "measured.non-finite-empty": "在没有可关注键的行上，{size} 个值中有 {n} 个不是有限值",
    "judge.half-non-finite": "fn 在 {dtype} 下给出 NaN/inf，而 float32 下是有限值：{cause}",
    "judge.one-maximum": "在 logits 远低于另一行的那些行上，fn 给出了 NaN/inf：它减去的是整个数组"
                         "的最大值（x.max()），而不是每一行的；"
                         "请减去 x.max(axis=-1, keepdims=True)",
    "judge.no-max-trick": "fn 对有限的输入给出了 NaN/inf：softmax 没有先减去最大值，exp() 上溢；"
                          "请先减去每行的最大值",
    "judge.non-finite": "参考实现给出有限值的地方，fn 给出了 NaN/inf",
    "judge.empty-row-nan": "没有可关注键的查询得到了 NaN（对全为 -inf 的一行做 softmax）："
                           "请单独处理这样的行，让它输出 0",
    "judge.weights": "返回的注意力权重与参考实现的 softmax 不一致（输出本身是对的）",
    "judge.row-uniform-additive": "均匀的一行（加性的 finfo.min 掩码，也就是 transformers 的 "
                                  "eager 注意力所用的那种，让这一行的分数全都相等）",
    "judge.row-uniform": "均匀的一行（{fill}，这一行的分数就全都相等了）",
    "judge.row-other": "既不是 0 也不是 NaN 的值",
    "judge.empty-row": "没有可关注键的查询得到了{what}；attnkit、SDPA 和 flash-attn 输出 0"
                       "（JAX 和 d2l 输出均匀的一行）",
    "measured.empty-rows": "本应为 0 的行上 max |out| 为 {value:.3g}",
    "judge.wrong-not-imprecise": "fn 的结果是错的，而不只是不够精确：误差最大为 {worst:.2g}，"
                                 "而规则只允许 {bound:.1g}（同精度 {dtype} 朴素实现误差的 2 "
                                 "倍）；请在这个用例上核对公式（复现代码会打印两个结果）",
    "judge.wrong-not-imprecise-half": "fn 在 {dtype} 下的结果是错的，而不只是不够精确：误差"
                                      "最大为 {worst:.2g}，而规则只允许 {bound:.1g}（同精度 "
                                      "{dtype} 朴素实现误差的 2 倍）；请在这个用例上核对公式"
                                      "（复现代码会打印两个结果）",
    "judge.beyond-rule": "fn 的结果与参考实现的差距，超过了同精度 {dtype} 朴素实现误差的 2 倍",
    "judge.beyond-rule-half": "fn 在 {dtype} 下的结果与参考实现的差距，超过了同精度 {dtype} "
                              "朴素实现误差的 2 倍",
    "judge.leak-no-mask": "声明了因果注意力，函数却让查询看到了靠后的键：它的输出就是不加因果"
                          "掩码的注意力（请加上因果掩码，只保留 j <= i + Tk - Tq 的键）",
    "judge.causal-here": "fn 在这些输入上掩蔽了未来（查询 i 看到键 j <= i + Tk - Tq），在别的"
                         "输入上却没有：如果它本应是因果的，请让它在每个输入上都是因果的，"
                         "并传入 causal=True（--causal）",
    "judge.top-left": "is_causal 按左上角对齐（查询 i 看到键 j <= i），与 PyTorch SDPA 和 JAX "
                      "相同；attnkit 和 flash-attn 按右下角对齐（j <= i + Tk - Tq）：Tq != Tk "
                      "时请传入你想要的掩码",
    "judge.leak-moved": "声明了因果注意力，函数却让查询看到了靠后的键：只改动查询 {query} 的"
                        "位置之后的键和值（j > {query} + Tk - Tq），它的输出就变了（请只保留 "
                        "j <= i + Tk - Tq 的键，右下角对齐）",
    "scale.none": "没有缩放（缺了 1/sqrt(Dk)）",
    "scale.over-dk": "除以了 Dk，而不是 sqrt(Dk)",
    "scale.times-sqrt-dk": "乘以了 sqrt(Dk)，而不是除以它",
    "scale.over-sqrt-dv": "按 1/sqrt(Dv) 缩放，用的是值的维度",
    "scale.default": "按 1/sqrt(Dk) 缩放，而不是要求的缩放",
    "judge.scale": "注意力分数{scaled}；缩放点积注意力用的是 1/sqrt(Dk) = {default:.4g}",
    "judge.axis": "fn 在第 {axis} 维上做归一化，而不是最后一维：最后一维上的每一行之和应为 1",
    "polarity.masked": "True 表示掩蔽",
    "polarity.keep": "True 表示可以关注",
    "polarity.sdpa": "bool 类型的 attn_mask：True 表示可以关注",
    "judge.polarity": "fn 按与“{convention}”约定（{meaning}）相反的含义读取掩码：它关注的恰好"
                      "是掩码排除的那些键",
    "judge.no-grad-fn": "fn 的输出不可微（没有 grad_fn）：它离开了自动微分（NumPy、.detach()、"
                        ".item()），或者新建了张量",
    "measured.no-grad-fn": "没有 grad_fn",
    "judge.backward-raises": "反向传播报错（{error}）",
    "judge.input-no-grad": "{name} 没有得到梯度",
    "measured.grad-none": "grad 为 None",
    "judge.grad-disagrees": "关于 {name} 的梯度与参考实现不一致（自定义了反向传播？）",
})

# -- 用例（core/cases.py） --------------------------------------------------------------
TEXTS.update({
    "case.label": "{name}：{details}",
    "case.basic": "基本",
    "case.masked": "带掩码",
    "case.fully-masked-row": "整行被掩蔽",
    "case.per-query-lengths": "每个查询各自的有效长度",
    "case.a-query-with-none": "有一个查询的有效长度为 0",
    "case.causal": "因果",
    "case.4-D": "四维",
    "case.probe": "探测",
    "case.head-dim": "头的维度 {n}",
    "case.length": "长度 {n}",
    "case.logits": "logits 约为 {n}",
    "case.mask": "掩码 {kind}",
    "case.mask-per-key": "掩码 {kind}，每个键一个标志",
    "case.mask-lens-2d": "valid_lens (B, Tq)，每个查询一个有效长度",
    "case.mask-lens-2d-empty": "valid_lens (B, Tq)，第 0 行的查询 0 有效长度为 0",
    "case.logits-spread": "查询 0 那一行的 logits 约为 {x}，其余各行约为 0",
    "case.rows-of-different-scale": "各行尺度相差很大",
    "case.logits-near": "logits 约为 {x}",
})

# -- 构造和加载用户给出的目标（meet/） ------------------------------------------------------
TEXTS.update({
    "origin.cell": "定义于 {file} 的单元格 {number}",
    "build.hint-factory": "请写一个工厂函数来检查：`def make(E, H): return {call}`，然后运行 "
                          "`attnkit check multi-head {where}:make`",
    "build.hint-instance": "请改为传入一个实例或函数：在文件开头写 `layer = {name}(...)`，然后"
                           "运行 `attnkit check ... {where}:layer`",
    "build.no-signature": "读不出 {name} 的签名（{error}）；{hint}",
    "build.no-config": "{signature} 接受一个配置对象（{name}），但没有找到配置类（请给它加上"
                       "类型注解，或在同一个文件里放一个带有宽度和头数的 dataclass）；{hint}",
    "build.a-function": "{signature} 直接接受输入：它是一个注意力函数，不是模块或模块的工厂函数；"
                        "请用 `attnkit check attention`（或 masked-softmax、softmax）检查它",
    "build.a-module": "{signature} 接受宽度和头数：它看起来是一个多头注意力模块；请用 `attnkit "
                      "check multi-head`（check_multi_head）检查它，检查器会按这些参数名构造它",
    "build.no-rule": "无法构造 {signature}：没有规则能填写必需的参数 {names}；{hint}",
    "build.built-as": "构造方式：{expr}",
    "build.instance-wide": "这个实例的宽度是 {width}",
    "build.instance-no-copy": "这个实例无法复制：{error}",
    "build.as-loaded": "实例 {name}，按加载时的样子",
    "build.fresh": "构造方式：{expr}，按实例的类新建一个（检查在宽度 {width} 下进行；{reason}）",
})

# -- 调用函数，以及报告的开头（function/） --------------------------------------------------
TEXTS.update({
    "try.layout-per-key": "{fw} {layout}，掩码 (B, Tk)",
    "try.raised": "{label}：{error}",
    "try.returned": "{label}：返回了 {type}",
    "try.output-shape": "{label}：输出形状为 {shape}，应为 {want}",
    "call.layouts-attention": "NumPy 数组和 PyTorch 张量，(B, H, T, D)、(B, T, D) 和 (B, T, H, D)",
    "call.layouts": "NumPy 数组和 PyTorch 张量",
    "call.fix": "检查器按 {args} 调用它：请按位置或按 query/key/value 这些名字接受输入，用 "
                "--convention 声明掩码，或者包一层：def fn(q, k, v): return mine(...)",
    "call.fix-unfilled": "它需要 {names}，检查器填不了：请包一层，例如 "
                         "lambda q, k, v: fn(q, k, v, {first}=...)；{fix}",
    "call.fix-instance": "请传入一个实例，或一个调用它的函数；{fix}",
    "call.no-output": "没有输出",
    "call.failed": "用{layouts}都没能调用 fn：{first}；{fix}",
    "measured.tried": "尝试了 {n} 种调用：{tries}",
    "call.nondeterministic": "同样的两次调用输出不同：暂退法还开着：请调用 `.eval()` 或把 dropout "
                             "设为 0（F.dropout 的 training 参数默认为 True：请传入 "
                             "training=self.training）",
    "call.nondeterministic-train": "同样的两次调用输出不同：暂退法还开着：请调用 `.eval()` 或把 "
                                   "dropout 设为 0（fn 是一个仍处于训练模式的模块）",
    "measured.differ-by": "同样的两次调用最多相差 {value:.3g}",
    "measured.differ-in-shape": "同样的两次调用形状不同",
    "call.not-callable": "{target} 是一个 {type} 对象，不能调用：请给出一个函数、实例或类",
    "measured.not-callable": "不能调用",
    "call.class-not-built": "{name} 是一个类，而检查器需要能调用的东西：{why}",
    "measured.not-built": "没能构造",
    "call.class-raised": "{name} 是一个类；构造它时报错 {error}；请改为传入一个实例或函数",
    "call.no-layout": "用任何一种输入布局都没能调用 fn：{tries}",
    "call.shape-error": "在尝试过的每一种输入布局上，fn 都报了形状错误（{first}）：少了一个应当"
                        "保留的维度（axis=..., keepdims=True）或一次转置",
    "call.per-query-lens": "fn 能处理 valid_lens (B,)，却不能处理 d2l 中每个查询各自的有效长度 "
                           "(B, Tq)（第 b 行的查询 i 看到键 j < valid_lens[b, i]）：{message}；"
                           "请先把 (B,) 变成 (B, Tq)，再与 np.arange(Tk) < valid_lens[..., None] "
                           "比较",
    "header.stand-in": "一个替身（training=False, num_key_value_groups=1）",
    "header.convention": "{name}（{how}）",
    "how.declared": "已声明",
    "how.from the signature": "由签名判断",
    "how.from behaviour": "由行为判断",
    "how.assumed": "假定",
    "header.passed-as": "，作为 {name}= 传入",
    "header.passed-as-keys": "，作为 {name}= (B, Tk) 传入",
    "header.the-mask": "掩码",
    "header.per-key": "，{name} (B, Tk)：每个键一个标志",
    "header.flags": "；{names} 保持默认值（不是掩码）",
    "header.fixed": "；{values}",
    "header.value": "{name}={value}",
    "header.layout-bthd": "输入和输出都是 (B, T, H, D)，头在第 2 维，与 JAX 和 flash-attn 相同"
                          "（转置后再判）",
    "header.output-bthd": "，输出 (B, Tq, H, Dv)（转置回来再判）",
    "header.declared-causal": "已声明为因果：按右下角对齐的因果注意力来判",
    "header.behaves-causal-judged": "表现为因果（按因果注意力来判；可用 --causal 声明）",
    "header.attends-every-key": "；在这些用例上关注全部的键（按此来判）：{names}",
})

# -- 加载目标（meet/targets.py，命令行） ---------------------------------------------------
TEXTS.update({
    "load.import": "导入 {where} 时报错 {error}",
    "load.cell": "{file} 的单元格 {number} 在定义 {name} 之前报错 {type}：{line}",
    "load.failed": "{error}；请修好它，或让 TARGET 指向一个能单独运行的文件",
    "measured.not-loaded": "没能加载",
})

# -- 半精度为什么出错（core/overflow.py） --------------------------------------------------
TEXTS.update({
    "overflow.helper": "某个 dtype 辅助函数或查找表里没有 {dtype} 这一项（遇到它就报错）：请从 "
                       "dtype 推出取值，例如 torch.finfo(dtype).min",
    "overflow.attribute": "{attr} 是一个作为普通属性保存的 float32 张量，.half() 和 .to() 不会"
                          "转换它（它们只转换参数和缓冲区）："
                          "请用 self.register_buffer({name}, ...) "
                          "注册它",
    "overflow.constant": "常数 {constant}（{line}）超出了 float16 的范围（最大值为 65504）：请把"
                         "被掩蔽的分数替换为 -inf 或 torch.finfo(dtype).min，并单独处理没有"
                         "可关注键的行",
    "overflow.range": "某个值超出了 {dtype} 的范围或精度（exp、平方和、分数的乘积）：请让 softmax "
                      "的统计量保持 float32",
    "overflow.setting": "{attr} = {value} 超出了 float16 的范围（最大值为 65504）：请把被掩蔽的"
                        "分数替换为 -inf 或 torch.finfo(dtype).min，并单独处理没有可关注键的行",
    "overflow.unread": "某个值超出了 {dtype} 的范围，而算出它的代码无法读取（库自带的函数，"
                       "或没有源文件的代码）：可能是对 {dtype} 过大的掩码常数或偏置常数、"
                       "较大分数的 exp，或平方和；请把被掩蔽的分数替换为 torch.finfo(dtype).min"
                       "（或 -inf，并单独处理没有可关注键的行），并让 softmax 的统计量保持 "
                       "float32",
    "overflow.mixed": "forward 里新建的某个张量仍是 float32（没有传 dtype= 的 torch.arange、"
                      "torch.zeros、cos/sin 表），它与 {dtype} 的值相遇，调用拒绝混合的 "
                      "dtype：请用 dtype=x.dtype 创建它，或用 .to(x.dtype) 转换",
    "overflow.fill": "把被掩蔽的分数替换成大负数",
    "overflow.fill-here": "把被掩蔽的分数替换成大负数 {value}",
    "overflow.nan-in-output": "输出中有 NaN/inf",
})
TEXTS.update({
    "header.default-raises": "；{name}=None 时报错（{error}），因此每个用例都传入掩码（没有掩码的"
                             "用例传入一个什么都不掩蔽的掩码）",
    "header.one-sequence": "fn 只接受单个序列（二维输入）：对每个批量行和每个头分别调用，再把输出"
                           "堆叠起来",
    "header.one-sequence-after": "；fn 只接受单个序列（二维输入）：对每个批量行和每个头分别调用，"
                                 "再把输出堆叠起来",
    "call.one-sequence": "fn 只接受单个序列，不接受批量：在带批量轴的输入上它报错 {error}；检查器"
                         "对每个批量行和每个头分别检查了它。如果它应当接受批量输入，请只交换最后"
                         "两个轴（np.swapaxes(k, -1, -2) 或 k.transpose(-1, -2)，而不是 k.T），"
                         "并在最后一个轴上做归约",
    "case.batched-inputs": "带批量轴的输入",
    "build.why-no-rule": "没有规则能填写必需的参数 {names}",
    "build.config-fields": "无法构造 {signature}：它的 {name}（{cls}）有检查器猜不出的字段"
                           "（{why}）；请写出工厂函数再检查：`def make(E, H): return {factory}`，"
                           "然后运行 `attnkit check {kind} {where}:make`",
})

# -- 用法错误：约定与函数不相符 ---------------------------------------------------------------
TEXTS.update({
    "fn.convention-choices": "约定只能是 {choices} 之一，得到的是 {got}",
    "fn.softmax-no-mask": "check_softmax 不接受掩码：约定只能是 'auto' 或 'none'，得到的是 {got}",
    "fn.masked-no-mask": "check_masked_softmax：fn 没有掩码参数；请传入 convention='valid_lens'、"
                         "'masked'、'keep' 或 'additive'",
    "fn.causal-sdpa": "causal=True 声明的是自己掩蔽未来位置的函数；而 sdpa 约定在因果用例中"
                      "已经传入 is_causal=True",
    "fn.per-query-lens": "per_query_lens=True 传入的是 d2l 的 valid_lens (B, Tq)，但 fn 的掩码"
                         "参数被读作 {conv}：如果它接受有效长度，请传入 convention='valid_lens'",
})
