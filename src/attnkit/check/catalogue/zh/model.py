"""中文: the sentences of the model checks."""

from __future__ import annotations

TEXTS: dict[str, str] = {}

# -- 模型检查的报告（model/report.py） --------------------------------------------------------
TEXTS.update({
    "model.title": "attnkit 检查模型：{model}",
    "model.inputs": "{dtype}，{inputs}；用时 {seconds:.1f} 秒",
    "model.ran": "已运行",
    "model.masks": "；掩码：",
    "model.not checked": "  [警告] 未检查：这个实现没有任何一次注意力调用被判定",
    "model.layer": "层",
    "model.calls": "调用",
    "model.worst": "最大误差 / 规则",
    "model.first failure": "首个出错位置",
    "model.empty rows": "无可关注键的行",
    "model.verdict": "结论",
    "model.vs": "与 {first} 之差：注意力输出 / 隐状态",
    "model.hidden": "与 {first} 相比，隐状态的最大差异为 {diff:.1e}，位于 {name}",
    "model.first failing": "自身注意力最先出错的层：{layer}",
    "model.at": "位置",
    "model.reproducer": "复现 {code} 的代码（输入保存在 {path}）：",
    "model.nothing judged": "没有判定任何一次注意力调用：这不算通过",
    "model.made here": "本层产生",
    "model.inherited": "继承自前面的层",
    "model.fn-in-layers": "{layers} 中的 {fn}",
    "model.row.ok": "通过",
    "model.row.not checked": "未检查",
    "model.hold.uniform": "均匀",
    "model.hold.other": "其他",
})
TEXTS.update({
    "model.note": "{name} 没有被检查（判定了 {calls} 次调用）：{status}",
    "model.no-eager": "{module} 没有定义 eager_attention_forward",
    "model.refused": "被拒绝：{why}",
    "model.no-interface": "这个模型的注意力不经过 transformers 的 AttentionInterface",
    "model.check-failed": "未判定：attnkit 的检查在第 {step} 步出错（{error}）；请报告这个问题",
    "model.stopped": "在第 {step} 步停止：{error}（其后的层没有运行）",
    "model.layer-step": "{layer}（第 {step} 步）",
    "model.at-prefill": "第 {step} 步（预填充）",
    "model.at-decoding": "第 {step} 步（解码）",
    "model.at-path": "第 {step} 步（{path}）",
    "model.described-tensors": "{tensors}，随机生成",
    "model.at-layer": "层 {layer}",
    "model.at-batch": "批量第 {i} 行",
    "model.at-head": "头 {i}",
    "model.at-query": "查询 {i}",
    "model.at-key": "键 {i}",
    "model.described": "批量大小 {batch}，长度 {length}，{padding}",
    "model.padding-left": "左侧填充",
    "model.padding-right": "右侧填充",
    "model.padding-none": "不填充",
    "model.described-given": "批量大小 {batch}，长度 {length}，调用者给的输入",
    "model.decoding": "，{n} 个解码步",
    "model.prefill-only": "，仅预填充",
    "model.mutates": "注意力函数原地写入了它的参数 {names}：模型的缓存或投影在它底下被改掉了",
    "model.shape": "注意力函数返回了 {shape}，transformers 期望 (B, Tq, H, Dv) = {want}",
    "model.shape-transposed": "注意力函数返回了 {shape}，transformers 期望 (B, Tq, H, Dv) = "
                              "{want}（(B, H, Tq, Dv) 的输出忘了转置？）",
    "model.mask-lets": "这次调用收到的掩码让批量第 {batch} 行的查询 {query}（位置 {q_pos}）看到了"
                       "键 {key}（位置 {k_pos}），它是{why}，模型的配置和填充方式本应排除它",
    "model.mask-hides": "这次调用收到的掩码对批量第 {batch} 行的查询 {query}（位置 {q_pos}）隐藏了"
                        "键 {key}（位置 {k_pos}），它是一个真实的键；模型的配置和填充方式允许"
                        "关注它",
    "model.failure-key": "第 {step} 步，批量第 {batch} 行，查询 {query}，键 {key}",
    "model.failure-head": "第 {step} 步，批量第 {batch} 行，头 {head}，查询 {query}",
    "model.failure-raised": "第 {step} 步：报错",
    "measured.pairs-differ": "{n} 个（行，查询）对不一致",
    "measured.rows": "{n} 行",
    "model.non-finite": "参考实现给出有限值的地方，注意力输出里出现了 NaN/inf",
    "model.non-finite-kv": "参考实现给出有限值的地方，注意力输出里出现了 NaN/inf（在掩码排除的 "
                           "{n} 个键上，k/v 含有 NaN/inf，例如来自前面某层没有可关注键的行："
                           "它们以 0 * NaN 的形式进入了输出）",
    "model.half-non-finite": "在 {dtype} 下出现 NaN/inf，而同样的调用在 float32 下是有限值："
                             "{cause}",
    "model.causal-leak": "注意力函数让查询看到了它收到的掩码所禁止的后续键（它忽略了掩码中的"
                         "因果部分，或者根本没有构造因果掩码）：一个词元的输出依赖于它之后的词元",
    "model.padding-ignored": "真实的查询把权重分给了填充位置上的键：注意力函数没有用上它收到的"
                             "掩码中的填充部分（它自己构造了因果掩码，或者丢掉了 attention_mask）",
    "model.polarity": "注意力函数按相反的含义读取它收到的掩码：它关注的恰好是掩码排除的那些键",
    "model.top-left": "在 Tq = {Tq} != Tk = {Tk} 的调用上（带 KV 缓存的一步），注意力函数把因果"
                      "掩码按左上角对齐（查询 i 看到键 j <= i）：模型要的是右下角对齐"
                      "（j <= i + Tk - Tq），所以解码时看到的键不对",
    "model.window": "注意力函数忽略了这一层 {window} 的滑动窗口（它关注了 {window} 个位置以前的"
                    "键，而它收到的掩码排除了这些键）",
    "model.scale": "注意力分数{scaled}（模型传入的是 scaling={scale:.4g}）",
    "model.beyond-rule": "注意力输出与参考实现的差距，超过了同精度 {dtype} 朴素实现误差的 2 倍",
    "model.half-raises": "注意力函数在 {dtype} 下报错，在 float32 下不报错（{error}）：{cause}",
    "model.raised": "注意力函数在第 {step} 步、层 {layer} 报错 {error}：{line}（q {q}，k {k}，"
                    "{dtype}）；其后的层没有运行",
    "model.empty-nan": "没有可关注键的查询（填充位置）得到了 NaN：它会经由填充的词元传到后面的层；"
                       "attnkit、SDPA 和 flash-attn 输出 0",
    "why.empty-slot": "一个空的缓存位置",
    "why.padded": "一个填充的键",
    "why.own-mask": "这一层自己的掩码代码排除的键",
    "why.future": "一个未来的键",
    "why.window": "滑动窗口 {window} 以外的键",
    "why.chunk": "另一个大小为 {chunk} 的分块中的键",
    "why.document": "另一个打包文档中的键",
    "why.other": "模型不允许关注的键",
    "why.real": "它应当看到的真实的键",
})
TEXTS.update({
    "mask.none": "没有掩码",
    "mask.is-causal": "（is_causal）",
    "mask.window": "（sliding_window={window}）",
    "mask.structured": "attnkit 的结构化掩码",
    "mask.block": "FlexAttention 的 BlockMask",
    "mask.bool": "布尔掩码",
    "mask.additive": "加性浮点掩码",
})
TEXTS.update({
    "model.embeddings": "嵌入",
    "model.after-layer": "第 {i} 层之后",
    "model.side-encoder": "编码器{what}",
    "model.side-decoder": "解码器{what}",
})
TEXTS.update({
    "model.layer not checked": "  [警告] 未检查：{layer}：{why}",
    "model.layers not checked": "{n} 个注意力层未检查：结论只涵盖其余各层",
})
# -- 关于模型的事实、运行被拒绝的原因（model/facts.py、steps.py、check.py、report.py） -----------
TEXTS.update({
    "model.fact line": "  注：{note}",
    "fact.own-mask": "{name}：{what}；按模型自己的代码构造的掩码来判定",
    "fact.causal-own": "因果掩码，由模型的代码自己构造（它的注意力模块写的是 is_causal=False）",
    "fact.bidirectional": "双向注意力（它的配置或模块写的是因果）",
    "fact.two-sided": "双侧窗口：每个查询看到它之前的 {back} 个键和之后的 {ahead} 个键",
    "fact.window": "宽度为 {n} 个键的滑动窗口",
    "fact.across-documents": "它跨打包的文档做注意力（模型不区分这些文档：要不要打包由调用者决定）",
    "fact.other-mask": "与配置所写不同的掩码",
    "model.too-long": "输入连同解码步需要 {tokens} 个位置，超过了这个模型的 {field} = {limit}："
                      "请给更短的 --length",
    "model.no-decoding": "解码不适用：{model} 没有语言模型头（logits）；只检查了预填充",
    "model.generate-path": "model.generate()，{cache}",
    "model.cache-dynamic": "动态缓存",
    "model.cache-static": "静态缓存",
    "model.failed because": "未通过：{reason}",
    "model.unloaded": "无法加载 {name}：{why}",
    "model.unchecked-under": "在 {name} 下有 {n} 个注意力层未检查：{names}",
    "model.and-more": "{names} 等，另有 {n} 个",
    "model.reproducer-unsaved": "# 无法保存复现代码：{error}",
})

# -- 命令和 check_model 拒绝运行的原因，各一行（model/load.py、check.py、session.py、
# command.py、zoo.py） -------------------------------------------------------------------------
TEXTS.update({
    "load.dtype": "dtype 必须是 {choices} 之一，收到的是 {got!r}",
    "load.tiny": "--tiny 必须是 {choices} 之一，收到的是 {got!r}",
    "load.not-found": "MODEL {model!r} 既不是含有 config.json 的本地文件夹，也不是一个 "
                      "config.json 文件（attnkit 不下载任何东西）",
    "load.unreadable": "MODEL {model!r}：无法读取 {file}：{error}",
    "load.remote-code": "MODEL {model!r} 需要 trust_remote_code（它带有自己的 Python 代码，"
                        "或者它的 model_type 不为 transformers 所知）：`attnkit check` 从不"
                        "运行这种代码",
    "load.unknown-type": "MODEL {model!r}：transformers 不认识 model_type {type!r}；读取它就要运行"
                         "模型自带的代码（trust_remote_code），`attnkit check` 从不这样做",
    "load.cannot-build": "MODEL {model!r}：无法构建模型：{error}",
    "load.cannot-load": "MODEL {model!r}：无法加载权重：{error}",
    "load.padding": "padding 必须是 'left'、'right' 或 'none'，收到的是 {got!r}",
    "load.sizes": "批量大小和长度都必须 >= 1，收到的是 {batch} 和 {length}",
    "load.no-input-ids": "输入中需要有 input_ids，收到的是 {got}",
    "load.ids-shape": "{name} 必须是形状为 (B, T) 的张量，收到的是 {got}",
    "load.ids-dtype": "{name} 必须是整数的词元 id，收到的是 {dtype} {shape}",
    "load.ids-empty": "{name} 的批量大小和长度都必须 >= 1，收到的是 {shape}",
    "load.ids-batch": "{name} {shape} 与 input_ids {want} 的批量大小不同",
    "load.ids-vocab": "{name} {shape} 中的 id 从 {low} 到 {high}；模型词表的 id 是 0 到 {last}",
    "load.mask-shape": "attention_mask {got} 与 input_ids {shape} 的形状不符",
    "load.mask-values": "attention_mask {got} 只能含 0（填充）和 1（真实的词元），"
                        "收到的值是 {values}",
    "load.positions-shape": "position_ids {got} 与 input_ids {shape} 的形状不符",
    "load.generate": "generate 必须 >= 0，收到的是 {got}",
    "load.sample": "sample 必须 >= 1 或者为 None，收到的是 {got}",
    "load.no-implementations": "implementations 是空的",
    "load.packed-decoding": "打包的输入（有 position_ids 而没有 attention_mask）只在预填充中检查："
                            "请传 generate=0",
    "load.unknown-implementation": "attn_implementation {name!r} 没有在 transformers 的 "
                                   "AttentionInterface 中注册（已注册的有：{known}）",
    "load.unknown-implementations": "implementations {names} 没有在 transformers 的 "
                                    "AttentionInterface 中注册（已注册的有：{known}）；用 "
                                    "AttentionInterface.register(name, fn) 注册你的实现",
    "load.no-architecture": "transformers {version} 中没有 {name}",
    "cmd.model-or-tiny": "请给出 MODEL（本地文件夹、config.json 或 FILE.py:NAME）或 --tiny "
                         "FAMILY，二者只能选一个",
    "cmd.no-implementations": "--implementations 是空的",
    "cmd.layers": "--layers 需要和 --implementation FILE.py:FN 一起用",
})
