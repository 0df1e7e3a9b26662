"""中文：``attnkit check`` 和 ``attnkit check model`` 的命令行（attnkit/cli.py、
model/command.py、check/command_words.py）：帮助、argparse 自己的用语、用法错误。"""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- argparse 自己的用语，以及一行的错误信息 -------------------------------------------------
TEXTS.update({
    "cli.usage": "用法：",
    "cli.positionals": "位置参数",
    "cli.options": "选项",
    "cli.help": "显示这段帮助并退出",
    "cli.error": "{prog}：错误：{message}（参见 {prog} --help）",
    "cli.required": "缺少必需的参数：{names}",
    "cli.invalid-choice": "参数 {name}：{value} 不是可选的值（可选值：{choices}）",
    "cli.unrecognized": "无法识别的参数：{args}",
    "cli.expected-one": "参数 {name} 后面需要一个值",
    "cli.expected-int": "参数 {name}：需要 >= {low} 的整数，得到的是 {value}",
    "cli.expected-number": "参数 {name}：需要一个正数，得到的是 {value}",
    "cli.argument": "参数 {name}：{message}",
    "cli.causal-kind": "--causal 只适用于 attention 和 multi-head，不适用于 {kind}",
    "cli.per-query-kind": "--per-query-lens 只适用于 masked-softmax 和 attention，不适用于 "
                          "{kind}",
    "target.spec": "应为 FILE.py:NAME、NOTEBOOK.ipynb:NAME 或 package.module:NAME，得到的是 "
                   "{spec}",
    "target.no-attribute": "{spec}：{where} 中没有属性 {name}",
    "target.no-file": "{where}：文件不存在",
    "target.not-python": "{where}：无法作为 Python 文件导入",
    "target.not-notebook": "{path}：不是 Jupyter 笔记本（{error}）",
    "target.no-cell": "{where}：没有哪个代码单元格定义了 {name}",
    "cli.target": "TARGET {target}：{error}",
    "cli.missing": "{user} 需要 {module}，但它没有安装：{install}",
    "cli.error-only": "{prog}：错误：{message}",
})

# -- attnkit check --help（attnkit/cli.py） --------------------------------------------------
TEXTS.update({
    "help.check": "用参考实现检查你的 softmax、注意力或多头注意力",
    "help.check.description": "在最容易让注意力出错的输入上（奇数的头维度、Tq != Tk、约 1e4 "
                              "的 logits、整行被掩蔽、半精度），把 NumPy 或 PyTorch 实现与 "
                              "attnkit 的 float64 参考实现比较，并逐条打印发现的问题：稳定的"
                              "代码、文字诊断、测得的误差和复现代码。只要有一条是错误，退出"
                              "状态就是 1。详见 docs/check.md。",
    "help.check.kind": "TARGET 是什么（multi-head：一个类，按其构造函数的参数名构建；或一个"
                       "工厂函数：TARGET(embed_dim, num_heads)）",
    "help.check.target": "path/to/file.py:name、notes.ipynb:name 或 package.module:name（函数、"
                         "实例、绑定方法如 file.py:layer.forward、类或工厂函数）",
    "help.check.convention": "掩码参数的约定：valid_lens（d2l 的有效长度）、masked（True 表示"
                             "被掩蔽）、keep（True 表示可以关注）、sdpa（attn_mask=、"
                             "is_causal=）、additive（加到注意力分数上的浮点掩码：0 或 "
                             "finfo.min）、none（默认 auto：根据签名和行为判断）",
    "help.check.causal": "TARGET 应当是因果的（attention、multi-head）：查询看到后面的位置"
                         "就是 causal-leak 错误",
    "help.check.per-query-lens": "与 valid_lens 一起用（masked-softmax、attention）：除了 "
                                 "(B,) 之外，也传入 d2l 中每个查询各自的长度 (B, Tq)",
    "help.json": "以 JSON 格式打印报告",
    "help.lang": "报告和这段帮助的语言：en 或 zh（中文）；两种语言的代码相同（默认："
                 "$ATTNKIT_LANG，否则为 en）",
    "help.check.epilog": "{usage}：检查一个模型（transformers 模型，或写成 FILE.py:NAME 的任意 "
                         "PyTorch 模型）的每一次注意力调用（参见 {help}）",
})

# -- attnkit check model --help（model/command.py） ------------------------------------------
TEXTS.update({
    "help.model.description": "在每种注意力实现下运行一个 transformers 模型（写成 FILE.py:NAME "
                              "的任意 PyTorch 模型则按原样运行），把每一次注意力调用（预填充，"
                              "以及使用 --generate 时的每个解码步）按它收到的"
                              "输入与 attnkit 的 float64 参考实现比较；把它收到的掩码与配置和"
                              "填充所要求的掩码比较；并逐层显示各实现从哪里开始不同。不下载"
                              "任何东西，也不运行模型自带的代码（没有 trust_remote_code）。"
                              "只要有一条是错误，退出状态就是 1。详见 docs/check.md。",
    "help.model.model": "本地模型文件夹（from_pretrained）、config.json（随机权重），或写成 "
                        "FILE.py:NAME 的任意 PyTorch 模型（一个 nn.Module，或不带参数就能构建"
                        "它的函数或类，或返回 (module, inputs) 的函数）：检查其中的 SDPA、"
                        "flex_attention 和 nn.MultiheadAttention 调用",
    "help.model.tiny": "代替 MODEL：这一系列的一个随机小模型",
    "help.model.implementations": "用逗号分隔的 attn_implementation 名称；差异以第一个为基准"
                                  "测量（默认：%(default)s）",
    "help.model.dtype": "模型的 dtype（默认：float32；FILE.py 中的模型保持它自己的 dtype）",
    "help.model.implementation": "你的注意力函数，签名与 F.scaled_dot_product_attention 相同："
                                 "它代替模型中的 SDPA 调用运行，每次调用都会被检查（为此 "
                                 "transformers 模型会切换到 sdpa）",
    "help.model.layers": "与 --implementation 一起用：只在这些层中替换（用逗号分隔的模块名或 "
                         "fnmatch 模式，例如 blocks.1.attn 或 'blocks.*.attn'）",
    "help.model.inputs": "输入，来自 .pt 文件（torch.load(weights_only=True)：一个张量、一个"
                         "元组，或关键字参数组成的字典）或 .safetensors 文件；文件中的代码"
                         "不会运行。FILE.py 中的模型没有给出输入时必须提供",
    "help.model.seed": "随机权重和随机输入的种子（默认：%(default)s）",
    "help.model.padding": "随机输入的填充方式（默认：%(default)s）",
    "help.model.batch": "随机输入的批量大小 B（默认：2）",
    "help.model.length": "随机输入的长度 T（默认：12）",
    "help.model.generate": "预填充之后、使用 KV 缓存的解码步数（默认：0）",
    "help.model.generate-api": "与 --generate 一起用：同时用动态缓存和静态缓存运行模型自己的 "
                               "generate()，检查其中每一次注意力调用",
    "help.model.sample": "每次调用最多只拿 N 个头和 N 个查询与参考实现比较（用于大模型）",
    "help.model.save": "存放复现代码 .pt 文件的文件夹（默认：一个临时文件夹）",
})
