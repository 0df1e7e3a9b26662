"""A long-sequence multi-head attention layer run across processes with ring attention.

    torchrun --nproc-per-node 2 examples/ring_mha.py
    torchrun --nproc-per-node 4 examples/ring_mha.py --seq-len 8192 --kv-heads 2

Every rank builds the same layer and the same input (one seed), keeps only its shard of
the sequence (zigzag layout), projects it, runs :func:`attnkit.distributed.ring_attention`
and projects back. Rank 0 then runs the same layer on the whole sequence in one process
(float64 as the reference, and in the run's dtype as the baseline) and checks the output
and every gradient by the 2x/3x/5x rule of DESIGN.md. Uses gloo on the CPU and NCCL when
every rank has a GPU. Without torchrun it runs as one process.
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from attnkit.distributed import gather_sequence, ring_attention, shard_sequence
from attnkit.testing import assert_close_by_rule, max_mean_error


class SelfAttention(nn.Module):
    """Multi-head self-attention with GQA; the attention function is pluggable.

    Args:
        embed_dim: ``E``.
        num_heads: ``H`` query heads.
        num_kv_heads: ``Hkv`` key/value heads (``H % Hkv == 0``).
        causal: causal mask over global positions.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int, *, causal: bool):
        super().__init__()
        if embed_dim % num_heads or num_heads % num_kv_heads:
            raise ValueError(f"need E % H == 0 and H % Hkv == 0: E={embed_dim}, H={num_heads}, "
                             f"Hkv={num_kv_heads}")
        self.num_heads, self.num_kv_heads, self.causal = num_heads, num_kv_heads, causal
        self.head_dim = embed_dim // num_heads
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * self.head_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)

    def forward(self, x: torch.Tensor, *, distributed: bool) -> torch.Tensor:
        """``x`` ``(B, T, E)`` (this rank's shard when ``distributed``) -> ``(B, T, E)``."""
        B, T, E = x.shape
        q = self.q_proj(x).view(B, T, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.num_kv_heads, self.head_dim).transpose(1, 2)
        # q (B, H, T, D), k and v (B, Hkv, T, D)
        if distributed:
            o = ring_attention(q, k, v, causal=self.causal)
        else:
            o = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal, enable_gqa=True)
        return self.out_proj(o.transpose(1, 2).reshape(B, T, E))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seq-len", type=int, default=4096, help="T, a multiple of 2 * world size")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--embed-dim", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv-heads", type=int, default=4)
    ap.add_argument("--no-causal", action="store_true")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = ap.parse_args()

    use_cuda = torch.cuda.is_available() and torch.cuda.device_count() > 0
    if "RANK" in os.environ:
        if use_cuda:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(
            "nccl" if use_cuda else "gloo", timeout=datetime.timedelta(seconds=120)
        )
    rank = dist.get_rank() if dist.is_initialized() else 0
    world = dist.get_world_size() if dist.is_initialized() else 1
    device = torch.device("cuda", torch.cuda.current_device()) if use_cuda else torch.device("cpu")
    dtype = getattr(torch, args.dtype)

    torch.manual_seed(0)  # the same layer and data on every rank
    layer = SelfAttention(args.embed_dim, args.heads, args.kv_heads, causal=not args.no_causal)
    x = torch.randn(args.batch, args.seq_len, args.embed_dim)
    target = torch.randn(args.batch, args.seq_len, args.embed_dim)

    # --- distributed: each rank holds T/P positions --------------------------------------
    ring_layer = layer.to(device, dtype)
    x_shard = shard_sequence(x.to(device, dtype), dim=1).requires_grad_(True)
    t_shard = shard_sequence(target.to(device, dtype), dim=1)
    t0 = time.perf_counter()
    y_shard = ring_layer(x_shard, distributed=True)
    loss = (y_shard.float() * t_shard.float()).sum()  # this rank's part of the total loss
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_ring = time.perf_counter() - t0
    # Parameter gradients are sums over the ranks' losses (as data parallel would do).
    grads = {}
    for name, p in ring_layer.named_parameters():
        g = p.grad.detach().clone()
        if world > 1:
            dist.all_reduce(g)
        grads[name] = g
    y = gather_sequence(y_shard.detach(), dim=1)
    dx = gather_sequence(x_shard.grad, dim=1)

    # --- one process, whole sequence: float64 reference and same-dtype baseline ----------
    if rank == 0:
        def single(dt: torch.dtype) -> tuple[dict[str, torch.Tensor], float]:
            ref_layer = SelfAttention(args.embed_dim, args.heads, args.kv_heads,
                                      causal=not args.no_causal).to(device, dt)
            ref_layer.load_state_dict(layer.state_dict())
            xr = x.to(device, dt).requires_grad_(True)
            t0 = time.perf_counter()
            yr = ref_layer(xr, distributed=False)
            (yr.double() * target.to(device, torch.float64)).sum().backward()
            if device.type == "cuda":
                torch.cuda.synchronize()
            res = {"out": yr.detach(), "dx": xr.grad}
            res.update({n: p.grad for n, p in ref_layer.named_parameters()})
            return res, time.perf_counter() - t0

        ref, _ = single(torch.float64)
        base, t_single = single(dtype)
        got = {"out": y, "dx": dx, **grads}
        print(f"ring attention layer: P={world}, T={args.seq_len}, B={args.batch}, "
              f"E={args.embed_dim}, H={args.heads}, Hkv={args.kv_heads}, {args.dtype}, "
              f"causal={not args.no_causal}, device={device.type}")
        print(f"forward+backward: ring {t_ring:.3f} s (rank 0, first call), "
              f"one process {t_single:.3f} s")
        for name in got:
            # Output: 2x; gradients: 5x (they pass through dQ as well as dK/dV).
            factor = 2.0 if name == "out" else 5.0
            err, _ = max_mean_error(got[name], ref[name])
            base_err, _ = max_mean_error(base[name], ref[name])
            assert_close_by_rule(got[name], ref[name], base[name], factor=factor, name=name)
            print(f"  {name:18s} max err {err:.2e}  (one-process {args.dtype}: {base_err:.2e})")
        print("OK: output and gradients match one process")
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
