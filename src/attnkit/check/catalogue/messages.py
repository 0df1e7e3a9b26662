"""The words of a report in each language: one catalogue, English and Chinese.

English is what the checks write as they go: each :class:`~attnkit.check.core.report.Finding`
carries a one-line English diagnosis composed on the spot (with its shapes and figures),
and :data:`~attnkit.check.core.report.CODES` gives every code its English title. This module
adds, for every code, a Chinese title and a Chinese diagnosis that says what the code
means and what to do, and the Chinese words of the report around the findings. The
measured figures, the case and the reproducer are printed as they are in both languages;
codes never change with the language.

Chinese terms follow the Chinese edition of d2l (zh.d2l.ai): 查询、键、值, 注意力汇聚,
掩蔽softmax, 有效长度, 缩放点积注意力, 多头注意力, 暂退法 (dropout).
"""

from __future__ import annotations

__all__ = ["LANGUAGES", "ZH_CODES", "ZH_MODEL_PHRASES", "ZH_MODEL_WORDS", "ZH_PHRASES",
           "ZH_WORDS", "check_language", "get_language", "set_language", "zh_phrases"]

import os

LANGUAGES = ("en", "zh")

# code -> (title, diagnosis and what to do). Every key of CODES has an entry (tested).
ZH_CODES: dict[str, tuple[str, str]] = {
    "shape": (
        "输出形状不对",
        "输出的形状与预期不符（预期形状见“实测”一栏）。多头注意力中最常见的原因是拆分或合并多个"
        "头时把 view 和 transpose 的顺序写错了。",
    ),
    "nan-or-inf": (
        "出现 NaN 或 inf",
        "参考实现给出有限值的地方，输出里出现了 NaN 或 inf。常见原因：softmax 没"
        "有先减去每行的最大值，exp 上溢；或者某一行的键全部被掩蔽，算出了 0/0。",
    ),
    "float16-overflow": (
        "半精度下溢出",
        "float32 下一切正常，换成 float16/bfloat16 就报错或出现非有限值"
        "。常见原因是用 -1e9 这类大负数填充被掩蔽的位置，而 float16 能表示的最大值"
        "只有 65504。改用 -inf，并单独处理整行都被掩蔽的情况；或者用 torch.fi"
        "nfo(dtype).min。",
    ),
    "mask-polarity": (
        "掩码的含义读反了",
        "掩码被按相反的含义使用了：本该掩蔽的键参与了注意力汇聚，本该参与的键反而被掩蔽。先确认约"
        "定：attnkit、SDPA 和 JAX 中 True 表示“可以关注”；nn.Mult"
        "iheadAttention 中 True 表示“掩蔽”。",
    ),
    "wrong-scale": (
        "缩放不对",
        "注意力分数没有除以 sqrt(d)（d 为查询和键的维度），或者除以了别的数。缩放点积注"
        "意力的评分函数是 q·k / sqrt(d)。",
    ),
    "inaccurate": (
        "误差超出规则",
        "与 float64 参考实现相比，误差超过了同精度朴素实现误差的 2 倍（梯度为 3 倍"
        "或 5 倍）。先核对公式，再看是否有不必要的精度损失。",
    ),
    "mutates-input": (
        "改写了传入的张量",
        "函数或模块原地写入了调用者传入的张量（例如 masked_fill_、mul_、x[ma"
        "sk] = ...），调用者的数据被悄悄改掉了。先复制一份，或改用不带下划线的非原地版本"
        "。",
    ),
    "gradient": (
        "梯度不对",
        "梯度与参考实现（或中心差分）不一致。手写的反向传播请逐项核对 softmax 的雅可比矩"
        "阵；用自动微分的，检查是否有 detach 或原地操作切断了计算图。",
    ),
    "unregistered-parameter": (
        "参数没有注册",
        "有需要训练的张量没有注册为模块的参数，优化器、.to() 和 state_dict 都看"
        "不到它。常见写法是把 nn.Linear 放进普通的 Python 列表；改用 nn.M"
        "oduleList，或直接赋给 self 的属性。",
    ),
    "no-gradient": (
        "参数没有梯度",
        "反向传播之后，某个已注册参数的梯度仍是 None：它没有参与前向计算。检查是否有定义了却"
        "没有用上的层。",
    ),
    "state-dict": (
        "state_dict 不能还原模块",
        "把 state_dict 载入一个新建的同类模块后，输出与原模块不同：有影响输出的状态没"
        "有被保存（例如没有注册的张量，或应当用 register_buffer 保存的量）。",
    ),
    "dropout-in-eval": (
        "eval() 之后暂退法仍在生效",
        "调用 eval() 之后，两次相同的调用结果仍然不同：暂退法（dropout）没有随 s"
        "elf.training 关闭。请使用 nn.Dropout 模块，或把 trainin"
        "g=self.training 传给 F.dropout。",
    ),
    "fully-masked-row": (
        "整行被掩蔽时输出不为 0",
        "没有任何可关注的键的查询，输出不为 0（常见的是变成所有值的平均）。这是约定上的差别，未"
        "必是错误；attnkit、SDPA（2.5 起）和 flash-attn 在这样的行上都"
        "输出 0。",
    ),
    "causal-alignment": (
        "因果掩码按左上角对齐",
        "查询长度 Tq 与键长度 Tk 不同时，因果掩码按左上角对齐（torch.tril 的默"
        "认写法），而不是右下角。用 KV 缓存逐词解码时，最后一个查询应当能看到全部的键。这是一"
        "种约定（SDPA 的 is_causal 也按左上角对齐），请确认它正是你想要的。",
    ),
    "call-failed": (
        "无法调用目标",
        "检查器没能调用这个目标，下面列出了尝试过的调用方式和异常的第一行。可以传入一个实例，写一"
        "个工厂函数 make(E, H)，或用 --convention 指明掩码参数的约定。",
    ),
    "nondeterministic": (
        "相同的两次调用结果不同",
        "同样的输入调用两次，输出却不同：暂退法（dropout）还开着。先调用 .eval()，"
        "或把 dropout 设为 0 再检查。",
    ),
    "causal-leak": (
        "泄露了未来的信息",
        "声明了因果注意力（--causal），但改动靠后的位置会改变靠前位置的输出：查询看到了它"
        "之后的键。检查因果掩码是否真的作用在了注意力分数上。",
    ),
    "mixes-queries": (
        "查询之间相互串扰",
        "只改动一个查询，其他查询的输出也跟着变了：每个查询的输出只应取决于它自己和键、值。多头"
        "注意力中最常见的原因是拆分或合并多个头时少了转置：拆分应写 x.view(B, T, H, Dk)."
        "transpose(1, 2)，而不是 x.view(B, H, T, Dk)；合并应写 out.transpose(1, 2)."
        "contiguous().view(B, T, E)，而不是直接 out.view(B, T, E)。否则各个词元被混在了一起。",
    ),
    "post-norm": (
        "后置层规范化",
        "要求的是前置层规范化（pre-norm，GPT-2 和 Llama 的写法），这个块却在残差相加之后才做"
        "层规范化（post-norm，原始 Transformer 的写法）：norm(x + attn(x))。应写成 "
        "x = x + attn(norm1(x))，再 x = x + mlp(norm2(x))，让 x 本身不经规范化地穿过整个块。",
    ),
    "residual": (
        "残差连接不对",
        "前置层规范化的块应是 x + 子层(规范化(x))：两个子层都输出 0 时块应原样返回 x，"
        "而且每个子层读到的都是规范化后的 x。这个块不是这样：要么子层的输出替换了 x 而不是加到 "
        "x 上，要么某个子层直接读了没有规范化的 x。",
    ),
    "mask-mismatch": (
        "收到的掩码与应有的不符",
        "实现收到的掩码，与按模型配置和填充方式构造的掩码不一致：某个查询可以看到未来或填充位置的"
        "键，或者看不到本该看到的键。",
    ),
}

# The words of the report around the findings (str.format fields as in report.py).
ZH_WORDS: dict[str, str] = {
    "title": "attnkit 检查 {check}：{target}",
    "framework": "框架",
    "convention": "约定",
    "layout": "布局",
    "causality": "因果性",
    "not found": "未识别",
    "cases": "共 {n} 个用例，用时 {seconds:.2f} 秒",
    "no findings": "没有发现问题：每个用例都与参考实现一致",
    "error": "错误",
    "warning": "警告",
    "detail": "详情（英文）",
    "measured": "实测",
    "case": "用例",
    "reproducer": "复现 {code} 的代码：",
    "ok": "通过",
    "failed": "未通过",
    "verdict": "{verdict}：{errors} 个错误，{warnings} 个警告",
    "no mask, causal": (
        "没有识别出掩码参数，因此没有测试掩码和整行被掩蔽的情况"
        "（可用 --convention valid_lens、masked、keep、sdpa 或 additive 声明）"
    ),
    "no mask": (
        "没有识别出掩码参数，因此没有测试掩码、整行被掩蔽和因果对齐"
        "（可用 --convention valid_lens、masked、keep、sdpa 或 additive 声明）"
    ),
    # attnkit check model (model_report.py)
    "model title": "attnkit 检查模型：{model}",
    "model seconds": "用时 {seconds:.1f} 秒",
    "masks": "掩码",
    "layer": "层",
    "calls": "调用",
    "worst": "最大误差 / 规则",
    "first failure": "首次失败",
    "empty rows": "空行",
    "row verdict": "结论",
    "versus": "与 {first} 比较：注意力 / 隐藏状态",
    "hidden": "隐藏状态与 {first} 相比：最大差异 {diff:.1e}，位于 {name}",
    "first failing layer": "自身注意力首先失败的层：{layer}",
    "at": "位置",
    "model reproducer": "复现 {code} 的代码（输入保存在 {where}）：",
}


# What the checks write into a report's header (convention, layout, causality, origin),
# in Chinese; applied in this order, longest first where one contains another. Names of
# conventions, parameters and shapes stay as they are: the reader meets them in code.
ZH_PHRASES: tuple[tuple[str, str], ...] = (
    ("(B, T, H, D) in and out, heads on axis 2 as JAX and flash-attn take them (transposed "
     "to judge it)",
     "输入和输出都是 (B, T, H, D)，头在第 2 维，与 JAX 和 flash-attn 相同"
     "（转置后再判）"),
    ("behaves as causal (judged as causal; pass --causal to declare it)",
     "表现为因果（按因果注意力来判；可用 --causal 声明）"),
    ("; attends every key (judged so) on: ", "；在这些用例上关注全部的键（按此来判）："),
    (" (B, Tk): one flag per key", " (B, Tk)：每个键一个标志"),
    ("behaves as causal: later positions do not change earlier outputs",
     "表现为因果：靠后的位置不改变靠前位置的输出"),
    ("bidirectional: later positions change earlier outputs",
     "双向：靠后的位置会改变靠前位置的输出"),
    ("declared causal: judged against bottom-right causal attention",
     "已声明为因果：按右下角对齐的因果注意力来判"),
    (" (declared causal)", "（已声明为因果）"),
    (" (transposed back to judge it)", "（转置回来再判）"),
    ("left at default (not a mask)", "保持默认值（不是掩码）"),
    ("took no known layout: masks not tested", "不接受任何已知的布局：未测试掩码"),
    (" (from the signature)", "（由签名判断）"),
    (" (from behaviour)", "（由行为判断）"),
    (" (declared)", "（已声明）"),
    (" (assumed)", "（假定）"),
    (" (found by trying)", "（试出来的）"),
    (", self-attention m(x)", "，自注意力 m(x)"),
    (", inputs by name ", "，按参数名传入 "),
    (", output ", "，输出 "),
    (", passed as ", "，作为 "),
    ("built as ", "构造方式："),
    ("defined in cell ", "定义于单元格 "),
    (" of ", "，文件 "),
)


def zh_phrases(text: str, phrases: tuple[tuple[str, str], ...] | None = None) -> str:
    """``text`` (a report header field written by a check) with its known phrases in
    Chinese (``phrases``, default :data:`ZH_PHRASES`); what is not a known phrase (names,
    shapes) is left as it is."""
    for en, zh in ZH_PHRASES if phrases is None else phrases:
        text = text.replace(en, zh)
    return text


def check_language(lang: str) -> str:
    """Return ``lang`` if a report can be written in it, else raise ``ValueError``."""
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {LANGUAGES}, got {lang!r}")
    return lang


_language: str | None = None


def set_language(lang: str | None) -> None:
    """Write reports in ``lang`` (``"en"`` or ``"zh"``) from now on, when they are printed
    without naming a language (``print(report)``); None goes back to the default."""
    global _language
    _language = None if lang is None else check_language(lang)


def get_language() -> str:
    """The language of ``print(report)``: the one :func:`set_language` chose, else the
    environment variable ``ATTNKIT_LANG`` (the Chinese notebooks set it to ``zh``), else
    English."""
    if _language is not None:
        return _language
    env = os.environ.get("ATTNKIT_LANG", "").strip().lower()
    return env if env in LANGUAGES else "en"


# The words of ``attnkit check model``'s report (attnkit.check.model.report), in Chinese;
# the English ones sit beside the table code. Layer paths, codes and figures stay as they are.
ZH_MODEL_WORDS: dict[str, str] = {
    "title": "attnkit 检查模型：{model}",
    "inputs": "{dtype}，{inputs}；用时 {seconds:.1f} 秒",
    "ran": "已运行",
    "masks": "；掩码：",
    "not checked": "  [警告] 未检查：这个实现没有任何一次注意力调用被判定",
    "layer": "层",
    "calls": "调用",
    "worst": "最大误差 / 规则",
    "first failure": "首个出错位置",
    "empty rows": "无可关注键的行",
    "verdict": "结论",
    "vs": "与 {first} 之差：注意力输出 / 隐状态",
    "hidden": "与 {first} 相比，隐状态的最大差异为 {diff:.1e}，位于 {name}",
    "first failing": "自身注意力最先出错的层：{layer}",
    "measured": "实测",
    "at": "位置",
    "reproducer": "复现 {code} 的代码（输入保存在 {path}）：",
    "verdict line": "{verdict}：{errors} 个错误，{warnings} 个警告",
    "OK": "通过",
    "FAILED": "未通过",
    "nothing judged": "没有判定任何一次注意力调用：这不算通过",
    "made here": "本层产生",
    "inherited": "继承自前面的层",
}

# How check_model describes its inputs ("batch 2, length 12, padding left, prefill only").
ZH_MODEL_PHRASES: tuple[tuple[str, str], ...] = (
    ("prefill only", "仅预填充"),
    (" decoding steps", " 个解码步"),
    (" decoding step", " 个解码步"),
    ("the caller's inputs", "调用者给的输入"),
    ("padding left", "左侧填充"),
    ("padding right", "右侧填充"),
    ("padding none", "不填充"),
    ("batch ", "批量大小 "),
    ("length ", "长度 "),
    (", ", "，"),
)
