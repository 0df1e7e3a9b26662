"""中文：对任意 PyTorch 模型做 ``check_model`` 时的句子（model/any_*.py、torch_calls.py、
accounting.py、any_command.py）。"""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- 运行与报告（model/any_model.py、accounting.py） -------------------------------------------
TEXTS.update({
    "any.one-forward": "{inputs}，前向计算一次",
    "any.inputs": "输入 {parts}",
    "any.no-inputs": "没有输入",
    "any.at-call": "第 {i} 次调用",
    "any.mutates": "注意力函数就地改写了它的参数 {names}（原地操作）",
    "any.no-reproducer": "# 未能保存复现代码：{error}",
    "any.none-judged": "没有任何一次注意力调用能被判定：{note}",
    "any.none-made": "模型没有发起任何注意力调用：有 {n} 个模块看上去是注意力"
                     "（{name}：{why}）",
    "any.no-attention": "{label} 既没有调用 scaled_dot_product_attention、flex_attention 或 "
                        "nn.MultiheadAttention，也没有注意力模块：无可检查",
    "any.not-module": "{type} 不是 torch.nn.Module：请传入模型、本地模型目录或 "
                      "FILE.py:build_model",
    "any.no-inputs-given": "{label} 不是 transformers 模型，又没有给出输入：请传入输入"
                           "（一个张量、张量组成的元组或关键字参数字典），或使用 "
                           "--inputs FILE.pt",
    "any.check-failed": "未判定：attnkit 自身的检查出错（{error}），请报告此问题",
    "any.stopped": "已中止：一次注意力调用抛出了 {error}；其后的层没有运行",
    "any.half-forward-nan": "{label} 在 {dtype} 下返回 NaN/inf，而同一个 forward 在 float32 "
                            "下是有限值：{cause}",
    "any.half-forward": "{label} 在 {dtype} 下抛出异常，而同一个 forward 在 float32 下能运行"
                        "（{error}）：{cause}",
    "any.model-raised": "{label} 抛出了 {error}（输入与它的 forward 对得上吗？）",
    "any.not-ran": "在这组输入上它没有运行",
    "any.not-ran-stopped": "运行在它之前就中止了（一次注意力调用抛出了异常）",
    "any.stopped-before": "运行在它之前就中止了",
    "any.no-interface": "它的调用没有一次经过 transformers 的 AttentionInterface（它的 forward "
                        "自己计算注意力，或者在这组输入上没有运行）",
    "any.inline": "它运行了，但没有调用 torch.nn.functional.scaled_dot_product_attention、"
                  "flex_attention 或 nn.MultiheadAttention：直接写在代码里的注意力无法按它收到"
                  "的输入来判定（请改为调用 F.scaled_dot_product_attention，或用 "
                  "--implementation 传入该函数）",
    "any.named-like": "名字像注意力",
    "any.refuses-sdpa": "--implementation 替换的是 SDPA 调用，而这个模型不接受 sdpa：{error}",
    "any.transformers-only": "implementations=、generate= 和 sample= 只适用于 transformers "
                             "模型；这个模型只运行它自己的 forward 一次，每次调用整体判定：要判定"
                             "你自己的注意力函数，请传入 implementation=fn",
    "any.bad-implementation": "implementation 应当是一个函数，或从层名模式到函数的映射，"
                              "收到的却是 {type}",
    "any.forward-raised": "{name}.forward 抛出了异常",
})

# -- 判定一次调用（model/any_judge.py、any_mha.py、any_flex.py） -------------------------------
TEXTS.update({
    "any.dropout": "dropout_p={p}（暂退法本身是随机的）：请在评估模式下调用模型，并在该处使用 "
                   "dropout_p=0.0",
    "any.sdpa-shape": "注意力函数返回的形状是 {shape}；SDPA 返回 {want}（与查询的形状相同，只是"
                      "最后一维换成值的最后一维）",
    "any.mask-ignored": "函数忽略了它收到的 attn_mask（被掩蔽的键也分到了权重）",
    "any.top-left": "在 Tq = {Tq} != Tk = {Tk} 时 is_causal 按右下角对齐；SDPA 的 is_causal "
                    "按左上角对齐（查询 i 只看键 j <= i）",
    "any.all-masked": "每个查询的键都被掩蔽了：没有可与参考实现比较的内容",
    "any.half": "在 {dtype} 下出现 NaN/inf，而同样的调用在 float32 下是有限值：{cause}",
    "any.half-raised": "这次调用在 {dtype} 下报错，而同样的调用在 float32 下能运行（{error}）："
                       "{cause}",
    "any.raised": "注意力调用抛出了 {error}（查询 {shape}，{dtype}）",
    "any.mha-shape": "nn.MultiheadAttention 返回的形状是 {shape}；按它的查询 {query}，"
                     "应为 (N, L, E) = {want}",
    "any.flex-grid": "这次 flex_attention 调用的 score_mod/mask_mod 无法在（批量、头、查询、"
                     "键）网格上求值（{error}）：未与参考实现比较",
    "any.flex-shape": "这次 flex_attention 调用的输出形状不是 (B, H, L, Ev)：未与参考实现比较",
})

# -- attnkit check model FILE.py:NAME（model/any_command.py、model/command.py） ----------------
TEXTS.update({
    "cmd.load": "{what} {spec}：{error}",
    "cmd.import-raised": "{what} {spec}：导入它所在的文件时抛出了异常：{error}",
    "cmd.not-callable": "MODEL {spec} 是 {type}：请指定一个 nn.Module，或不带参数就能构建它的"
                        "函数或类",
    "cmd.factory-raised": "MODEL {spec}：不带参数调用它时抛出了 {error}",
    "cmd.not-module": "MODEL {spec} 给出的是 {type}，不是 nn.Module（也不是 (module, inputs) "
                      "二元组）",
    "cmd.not-function": "--implementation {spec} 是 {type}，不是与 "
                        "F.scaled_dot_product_attention 签名相同的函数",
    "cmd.suffix": "--inputs {path} 必须是 .pt 或 .safetensors 文件（用 torch.save 或 "
                  "safetensors.torch.save_file 保存）",
    "cmd.no-file": "--inputs {path}：文件不存在",
    "cmd.safetensors": "--inputs {path}：读取 .safetensors 需要先 `pip install safetensors`",
    "cmd.unreadable": "--inputs {path} 无法用 torch.load(weights_only=True) 或 safetensors 读取"
                      "（只能包含张量和普通容器，不能包含代码）：{error}",
    "cmd.transformers-only": "--generate、--sample 和 --implementations 只适用于 transformers "
                             "模型；FILE.py 中的模型只运行它自己的 forward 一次（要检查你自己的"
                             "注意力函数，请用 --implementation FILE.py:FN）",
    "cmd.no-inputs": "MODEL {spec} 没有给出输入：请传入 --inputs FILE.pt（或 .safetensors），"
                     "或让 {model} 返回 (model, inputs)",
})
