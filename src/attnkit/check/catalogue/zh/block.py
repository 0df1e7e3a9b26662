"""中文：块检查（``check_block``）的句子。"""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "report.running-block": "块",
    "block.shape": "输入 x 的形状是 {want}，块却返回了 {shape}；块的输出应与输入形状相同",
    "block.nan-or-inf": "输入是大小约为 1 的 float32 数据，块的输出里却有 NaN 或 inf",
    "measured.non-finite-output": "输出非有限",
    "block.causal-leak": "声明为因果，这个块却让位置 i 看到了后面的位置：改动 x 在位置 3 和 4 "
                         "的值，位置 0..2 的输出也变了（它的注意力需要 causal=True，或者在分数上"
                         "加因果掩码）",
    "block.post-norm": "这个块在残差相加之后才做层规范化（后置层规范化：norm(x + attn(x))）；"
                       "要求的是前置层规范化：x = x + attn(norm1(x))，再 x = x + mlp(norm2(x))，"
                       "让 x 本身不经规范化地穿过整个块",
    "measured.returned-norm": "两个子层都输出 0 时，块返回的是 norm(x)，而不是 x",
    "block.replaces": "两个子层都输出 0 时，块应原样返回 x；它没有：子层的输出替换了 x，"
                      "而不是加到 x 上（应写 x = x + attn(norm1(x)) 和 x = x + mlp(norm2(x))）",
    "measured.max-from-x": "max |block(x) - x| 为 {value:.3g}",
    "block.unnormed": "block(c x) - c x 随 c 增大：某个子层读的是没有规范化的 x（前置层规范化"
                      "让每个子层读 norm(x)：attn(norm1(x))、mlp(norm2(x))）",
    "measured.growth": "|block(100 x) - 100 x| / |block(x) - x| = {value:.3g}",
    "case.block-x": "float32 x {shape}",
    "case.block-zeroed": "float32 x {shape}，规范化层以外的权重全部置 0",
    "case.block-scaled": "float32 x 与 100 x",
}
