"""A transformers Llama running on attnkit: one line to switch, the same tokens as SDPA.

    python examples/transformers_llama.py
    python examples/transformers_llama.py --layers 4 --width 256 --new-tokens 32

Builds a small random-weight Llama (no download), then with attnkit and with transformers'
``sdpa``: greedy generation on a left-padded batch (dynamic and static cache), attention
weights with ``output_attentions=True`` (which ``sdpa`` cannot return), and one training
step on packed sequences (documents told apart by position ids that restart), whose loss
and gradients are compared.
"""

from __future__ import annotations

import argparse
import copy

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from attnkit.integrations.transformers import register


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--new-tokens", type=int, default=8)
    args = ap.parse_args()

    config = LlamaConfig(
        vocab_size=128, hidden_size=args.width, intermediate_size=2 * args.width,
        num_hidden_layers=args.layers, num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads, pad_token_id=0, bos_token_id=None,
        eos_token_id=None, initializer_range=0.1,
    )
    torch.manual_seed(0)
    # The one line: attnkit's attention function and mask function, registered by name.
    model = AutoModelForCausalLM.from_config(config, attn_implementation=register()).eval()
    peer = copy.deepcopy(model)
    peer.set_attn_implementation("sdpa")

    # 1. Greedy generation on a left-padded batch.
    ids = torch.randint(1, 128, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    mask[2, :6] = 0
    ids = ids.masked_fill(mask == 0, 0)
    for cache in ("dynamic", "static"):
        kw = dict(attention_mask=mask, max_new_tokens=args.new_tokens, do_sample=False,
                  cache_implementation=cache)
        with torch.no_grad():
            ours, theirs = model.generate(ids, **kw), peer.generate(ids, **kw)
        print(f"generate ({cache} cache): same tokens as sdpa: {torch.equal(ours, theirs)}")
        print("  ", ours[:, ids.shape[1]:].tolist())

    # 2. Attention weights, straight from attnkit's fused path.
    with torch.no_grad():
        out = model(ids, attention_mask=mask, output_attentions=True)
    w = out.attentions[0]  # (B, H, Tq, Tk)
    real = mask[2].bool()
    print(f"output_attentions: {len(out.attentions)} layers of {tuple(w.shape)}; "
          f"row sums over real tokens of sequence 2: {w[2, 0][real].sum(-1).tolist()}")

    # 3. Packed training step: three documents in one row, no padding, no 2-D mask.
    packed = torch.randint(1, 128, (1, 12), generator=torch.Generator().manual_seed(2))
    position_ids = torch.cat([torch.arange(n) for n in (5, 4, 3)])[None]
    losses, grads = [], []
    for m in (model, peer):
        m.zero_grad(set_to_none=True)
        loss = m(packed, position_ids=position_ids, labels=packed).loss
        loss.backward()
        losses.append(loss.item())
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]))
    err = (grads[0] - grads[1]).abs().max().item()
    print(f"packed step: loss {losses[0]:.6f} (sdpa {losses[1]:.6f}), "
          f"max gradient difference {err:.2e}")


if __name__ == "__main__":
    main()
