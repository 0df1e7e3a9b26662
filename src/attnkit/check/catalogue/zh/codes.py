"""中文: what each code means (zh/__init__.py)."""

from __future__ import annotations

CODES: dict[str, dict[str, str]] = {
    "call-failed": dict(
        title="无法调用目标",
        what="检查器没能构造、加载或调用这个目标，因此什么也没有判定。",
        why="检查器调用不了的目标就是没人测过的目标；报告列出了尝试过的调用方式和每次异常的第一行。",
        fix="传入一个实例，或写一个工厂函数 make(E, H)；用 --convention 指明掩码参数的约定；"
            "检查器填不了的参数，用 lambda 包一层。"),
    "nondeterministic": dict(
        title="相同的两次调用结果不同",
        what="同样的输入调用两次，输出却不同。",
        why="这样与参考实现的每一次比较都只是噪声；通常是暂退法（dropout）还开着。",
        fix="先调用 .eval()，或把 dropout 设为 0（给 F.dropout 传 training=self.training）。"),
    "shape": dict(
        title="输出形状不对",
        what="输出的形状与预期不符，或者在本该接受的形状上报错。",
        why="多头注意力中最常见的原因是拆分或合并多个头时把 view 和 transpose 的顺序写错了，"
            "或者求和时没有保留维度（keepdims）。",
        fix="拆分写 x.view(B, T, H, D).transpose(1, 2)，合并写 "
            ".transpose(1, 2).reshape(B, T, H * D)；归约时用 keepdims 保留维度。"),
    "nan-or-inf": dict(
        title="出现 NaN 或 inf",
        what="参考实现给出有限值的地方，输出里出现了 NaN 或 inf。",
        why="softmax 没有先减去每行的最大值，exp 在 logits 约为 1e3 时上溢；或者某一行的键"
            "全部被掩蔽，算出了 0/0。",
        fix="在 exp 之前减去每行的最大值；没有可关注键的行输出 0。"),
    "float16-overflow": dict(
        title="半精度下溢出",
        what="float32 下一切正常，换成 float16/bfloat16 就报错或出现非有限值。",
        why="float16 能表示的最大值只有 65504：替换被掩蔽分数的 -1e9 这类常数会变成 -inf，exp "
            "也更早上溢。",
        fix="把被掩蔽的分数替换为 -inf（并单独处理整行都被掩蔽的情况）或 torch.finfo(dtype).min；"
            "softmax 的统计量保持 float32。"),
    "mask-polarity": dict(
        title="掩码的含义读反了",
        what="掩码被按相反的含义使用了：本该掩蔽的键参与了注意力汇聚，本该参与的键反而被掩蔽。",
        why="attnkit、SDPA 和 JAX 中 True 表示“可以关注”；nn.MultiheadAttention 的 attn_mask "
            "中 True 表示“掩蔽”。两者混用，填充位置就被悄悄关注了。",
        fix="只用一种约定：保留掩码写 scores.masked_fill(~keep, -inf)，True 表示掩蔽的写 "
            "scores.masked_fill(masked, -inf)。"),
    "mask-mismatch": dict(
        title="收到的掩码与应有的不符",
        what="注意力调用收到的掩码，与按模型配置和输入的填充方式构造的掩码不一致。",
        why="某个查询看到了未来或填充位置的键，或者看不到本该看到的键，其后的每一层都会受影响。",
        fix="按配置（因果、滑动窗口、分块）和填充方式构造掩码；报告给出了第一个不一致的查询和键。"),
    "wrong-scale": dict(
        title="缩放不对",
        what="注意力分数没有除以 sqrt(Dk)（Dk 为查询和键的维度），或者除以了别的数。",
        why="缩放点积注意力是 softmax(q k^T / sqrt(Dk)) v：缩放不对，注意力权重就会过于尖锐"
            "或过于平坦。",
        fix="把分数乘以 1 / math.sqrt(q.shape[-1])，用的是每个头的维度，不是模型宽度。"),
    "inaccurate": dict(
        title="误差超出规则",
        what="与 float64 参考实现相比，误差超过了同精度朴素实现误差的 2 倍（梯度为 3 倍或 5 倍）。",
        why="超出这一规则，要么公式错了，要么损失了朴素实现能保住的精度。",
        fix="先在报告给出的用例上核对公式（复现代码会打印两个结果），再看是否有不必要的精度损失。"),
    "mutates-input": dict(
        title="改写了传入的张量",
        what="代码原地写入了调用者传入的张量（例如 masked_fill_、mul_、x[mask] = ...）。",
        why="调用者的数据被悄悄改掉了：缓存、掩码或一批数据在调用之后都不对了。",
        fix="先复制一份，或改用不带下划线的非原地版本（masked_fill 而不是 masked_fill_）。"),
    "gradient": dict(
        title="梯度不对",
        what="梯度与参考实现（或中心差分）不一致。",
        why="训练沿着梯度走：梯度错了，模型就会在不报错的情况下训练成别的样子。",
        fix="手写的反向传播请逐项核对 softmax 的雅可比矩阵；用自动微分的，检查是否有 detach "
            "或原地操作切断了计算图。"),
    "unregistered-parameter": dict(
        title="参数没有注册",
        what="有需要训练的张量没有注册为模块的参数。",
        why="优化器、.to()/.half() 和 state_dict() 都看不到它：它既不会被训练，也不会被保存。",
        fix="把层放进 nn.ModuleList/nn.ModuleDict（不要用普通的 Python 列表），张量用 "
            "nn.Parameter。"),
    "no-gradient": dict(
        title="参数没有梯度",
        what="反向传播之后，某个已注册参数的梯度仍是 None。",
        why="它没有参与前向计算：定义了却没有用上的层。",
        fix="在 forward 中用上这一层，或者删掉它。"),
    "state-dict": dict(
        title="state_dict 不能还原模块",
        what="把 state_dict 载入一个新建的同类模块后，输出与原模块不同。",
        why="有影响输出的状态没有被保存：保存下来的模型不是原来的模型。",
        fix="把每个影响输出的张量注册为参数，或用 register_buffer 保存。"),
    "dropout-in-eval": dict(
        title="eval() 之后暂退法仍在生效",
        what="调用 eval() 之后，两次相同的调用结果仍然不同：暂退法没有随 self.training 关闭。",
        why="评估和推理都带上了随机性，结果比训练好的模型更差。",
        fix="使用 nn.Dropout 模块，或把 training=self.training 传给 F.dropout。"),
    "causal-leak": dict(
        title="泄露了未来的信息",
        what="声明了因果注意力，但查询看到了它之后位置上的键。",
        why="这样训练的语言模型能直接读到它要预测的答案。",
        fix="在 softmax 之前掩蔽 j > i + Tk - Tq 的键的分数（右下角对齐）。"),
    "padding-ignored": dict(
        title="忽略了填充掩码",
        what="真实的查询把权重分给了填充位置上的键：注意力没有用上传给它的填充掩码。",
        why="同一句话只因批量里补齐的方式不同，输出就不同；填充词元的信息也混进了每个真实位置。",
        fix="在 softmax 之前把填充掩码（attention_mask、key_padding_mask 或有效长度）连同因果"
            "掩码一起作用到分数上。"),
    "mixes-queries": dict(
        title="查询之间相互串扰",
        what="只改动一个查询，其他查询的输出也跟着变了。",
        why="每个查询的输出只应取决于它自己和键、值；串扰来自拆分或合并多个头时少了转置，"
            "各个词元被混在了一起。",
        fix="拆分应写 x.view(B, T, H, D).transpose(1, 2)，而不是 x.view(B, H, T, D)；合并应写 "
            "out.transpose(1, 2).reshape(B, T, E)，而不是直接 out.view(B, T, E)。"),
    "post-norm": dict(
        title="要求前置层规范化，块却用了后置层规范化",
        what="这个块在残差相加之后才做层规范化：norm(x + attn(x))（后置层规范化，原始 "
             "Transformer 的写法），而要求的是前置层规范化：x + attn(norm(x))（GPT-2 和 "
             "Llama 的写法）。",
        why="前置层规范化的块让 x 本身不经改动地穿过，层数很深时不用预热也能训练；后置层规范化"
            "在每一层的残差路径上都加了一次规范化。",
        fix="写成 x = x + attn(norm1(x))，再 x = x + mlp(norm2(x))：规范化放在分支里面，"
            "不要放在相加之后。"),
    "residual": dict(
        title="块的残差连接不是 x + 子层(规范化(x))",
        what="块的残差路径不是 x + 子层(规范化(x))：要么子层的输出替换了 x 而不是加到 x 上，"
             "要么某个子层直接读了没有规范化的 x。",
        why="少了相加的那条路径，堆叠起来的块会丢掉输入，很难训练；直接读 x 的子层看到的输入"
            "一层比一层大。",
        fix="把每个子层的输出加到 x 上，并让每个子层读规范化后的 x：x = x + attn(norm1(x))，"
            "x = x + mlp(norm2(x))。"),
    "fully-masked-row": dict(
        title="整行被掩蔽时输出不为 0",
        what="没有任何可关注的键的查询，输出不为 0（常见的是变成所有值的平均）。",
        why="这是约定上的差别，未必是错误：attnkit、SDPA（2.5 起）和 flash-attn 在这样的行上"
            "输出 0，JAX 和 d2l 输出均匀的行。",
        fix="如果想要 0，在 softmax 之后把掩码不允许任何键的行置零。"),
    "causal-alignment": dict(
        title="因果掩码按左上角对齐",
        what="查询长度 Tq 与键长度 Tk 不同时，因果掩码按左上角对齐（查询 i 看到键 j <= i），"
             "而不是右下角（j <= i + Tk - Tq）。",
        why="用 KV 缓存逐词解码时需要右下角对齐：最后一个查询应当能看到全部的键。SDPA 的 "
            "is_causal 也按左上角对齐，所以对单独的函数这是一种约定；在模型里则是错误。",
        fix="用 torch.ones(Tq, Tk).tril(Tk - Tq) 构造掩码。"),
    "one-sequence": dict(
        title="函数只接受单个序列",
        what="这个函数是为单个序列写的（二维输入，例如形状为 (T, D) 的 q、k、v），带批量轴的输入"
             "会出错；检查器对每个批量行和每个头分别调用它，再把结果堆叠起来判断。",
        why="只要本意如此，这是一种布局而不是错误；带批量轴时常见的出错原因是 k.T 把所有的轴都"
            "倒了过来，而不只是最后两个。",
        fix="如果它应当接受批量输入，请只交换最后两个轴（np.swapaxes(k, -1, -2) 或 "
            "k.transpose(-1, -2)），并在最后一个轴上做归约。"),
}
