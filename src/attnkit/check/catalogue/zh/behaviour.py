"""中文：输出与参考实现不符时，它实际算出的是什么（core/behaviour.py）。"""

from __future__ import annotations

TEXTS: dict[str, str] = {
    "judge.mask-ignored": "输出是在所有键上算的，就像没有掩码一样：掩码（或有效长度 valid_lens）"
                          "根本没有作用到 softmax 上；请在 softmax 之前把被掩蔽的键的分数设为 "
                          "-inf",
    "judge.weights-unmasked": "返回的注意力权重是对所有键做的 softmax（输出本身是对的）：返回的"
                              "权重在计算时没有用掩码（mask）；请返回计算输出时用的那份掩蔽后的"
                              "权重",
    "judge.query-axis": "softmax 是沿查询（axis -2）归一化的，而不是沿键：权重的每一列之和为 1，"
                        "而不是每一行；请沿最后一个轴（键所在的轴，axis=-1）做 softmax",
    "judge.lens-on-queries": "有效长度 valid_lens 截断的是查询（axis 1），不是键：查询 "
                             "i < valid_lens[b] 看到所有键，其余查询输出为 0；请用键的下标"
                             "（最后一个轴，axis=-1）和有效长度比较",
    "judge.first-length": "每个查询都用了查询 0 的有效长度：每个查询各自的 valid_lens (B, Tq) "
                          "被截成了第一列（per-query 的长度丢了）；请把键 j 与 valid_lens[b, i] "
                          "比较（valid_lens[:, :, None]）",
    "judge.parts-averaged": "输出是把键分成 {n} 段（第一段 {size} 个键）、每段各自归一化后的"
                            "简单平均：每段的权重应是它在 softmax 总和中所占的份额 "
                            "exp(lse_part - lse)；在在线（online）循环中，旧的累加量要先乘以 "
                            "alpha = exp(m_old - m_new) 重新缩放（rescale），最后只除一次",
    "judge.parts-unnormalised": "输出是把键分成 {n} 段（第一段 {size} 个键）后，用权重 "
                                "exp(lse_part - max(lse)) 合并的，这些权重之和不为 1：合并后的 "
                                "lse 应是各段 lse 的 np.logaddexp，而不是它们的最大值",
    "judge.blocks-not-rescaled": "输出是把键分块（{n} 块，第一块 {size} 个键）计算、但累加量从未"
                                 "重新缩放（rescale）的结果：当运行中的最大值从 m_old 增大到 "
                                 "m_new 时，旧的和与累加器都要乘以 alpha = exp(m_old - m_new)",
    "judge.zero-slots": "输出相当于：查询不该看到的每个键都是零向量、值也是零向量（分数为 0，"
                        "仍参与 softmax）——从未填写的槽位也被注意到了；请只返回缓存（cache）"
                        "中已填写（filled）的部分（[..., :length, :]），或把这些键掩蔽为 -inf",
    "judge.unread-keys": "改变位置 {keys}（共 {Tk} 个）上的键和值，任何输出都不变：代码根本没有"
                         "读到它们；请检查取键的切片或循环边界（range() 跳过了最后一个较短的块"
                         "（block）；缓存（cache）的 append 总写在位置 0，或 keys() 返回了从未"
                         "填写的槽位）",
    "judge.lse-max-not-added": "每一行都被乘上了 exp(该行最大值)：在 log-sum-exp 里减去的最大值没有"
                               "加回去；应为 lse = m + log(sum(exp(x - m)))，"
                               "m 为该行最大值",
    "judge.no-max-trick-attention": "fn 对有限的输入给出了 NaN/inf：对原始分数或对 log-sum-exp"
                                    "（lse）直接取 exp() 上溢；请先减去每行的最大值，合并各段时用 "
                                    "exp(lse_part - lse)，而不是 exp(lse_part)",
}
