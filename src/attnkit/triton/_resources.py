"""Developer tool: compile every autotune tile for sm_90 and print its resource use.

No GPU is needed: Triton's front end and the ``ptxas`` it ships compile for a target
named by hand. The report (registers, local-memory stack = spills, shared memory) is how
the tile tables in :mod:`attnkit.triton._forward` and :mod:`attnkit.triton._backward` were
chosen. Uses Triton internals (``ASTSource``, specialization attributes) as of Triton 3.9;
other versions may need changes::

    python -m attnkit.triton._resources --dims 64 128 --variants plain causal
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from triton.runtime.jit import JITFunction

from . import _backward, _forward

_FLOATS = ("qk_scale", "qk_scale2", "sc_in", "sc_out", "sc_out2", "scale")
# float32 tensors
_STATS = ("LSE", "LSE_LO", "SLOPES", "SINKS", "DELTA", "DLSE", "O_PART", "LSE_PART")
_INDEX = ("Q_IDS", "KV_IDS", "KV_LO", "KV_HI", "Q_LO", "Q_HI", "VISITS")  # int32 tensors
_TENSORS = ("Q", "K", "V", "O", "DO", "DQ", "DK", "DV") + _STATS + _INDEX
_FLAGS = ("HAS_LEFT", "HAS_RIGHT", "HAS_SOFTCAP", "HAS_ALIBI", "HAS_SINKS", "HAS_SEG")
_VARIANTS = {  # the flags each variant sets (the others are off)
    "plain": (),
    "causal": ("HAS_RIGHT",),
    "window": ("HAS_LEFT", "HAS_RIGHT"),
    "sinks": ("HAS_RIGHT", "HAS_SINKS"),
    "segments": ("HAS_RIGHT", "HAS_SEG"),
    "all": _FLAGS,
}


def compile_sm90(kernel, consts: dict, dtype: str, num_warps: int, num_stages: int):
    """Compile ``kernel`` as a real launch would specialize it: 16-byte aligned pointers,
    strides and lengths divisible by 16, unit stride along the head dim."""
    fn = kernel
    while not isinstance(fn, JITFunction):
        fn = fn.fn  # unwrap the autotuner
    signature, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts or (name.startswith("stride_") and name.endswith("d")):
            signature[name] = "constexpr"
            constexprs[(i,)] = consts.get(name, 1)
        elif name in _TENSORS:
            signature[name] = ("*fp32" if name in _STATS else "*i32" if name in _INDEX
                               else f"*{dtype}")
            attrs[(i,)] = [["tt.divisibility", 16]]
        else:
            signature[name] = "fp32" if name in _FLOATS else "i32"
            if name.startswith("stride_") or name in ("Tq", "Tk"):
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=num_warps, num_stages=num_stages))


def resources(compiled) -> tuple[int, int, int]:
    """(registers, stack bytes, shared-memory bytes) from the cubin."""
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                        "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([tool, "-res-usage", f.name], capture_output=True,
                             text=True).stdout
    m = re.search(r"REG:(\d+).*?STACK:(\d+)", out)
    regs, stack = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    return regs, stack, int(compiled.metadata.shared)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--variants", nargs="+", default=["plain", "causal"],
                        choices=sorted(_VARIANTS))
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = parser.parse_args(argv)
    kernels = [("fwd", _forward._fwd_kernel, _forward._FWD_TABLE, "BLOCK_M", "BLOCK_N"),
               ("dkdv", _backward._bwd_dkdv_kernel, _backward._DKDV_TABLE, "BLOCK_N", "BLOCK_M"),
               ("dq", _backward._bwd_dq_kernel, _backward._DQ_TABLE, "BLOCK_M", "BLOCK_N")]
    print("kernel  D    variant  tile          warps stages  regs  spill  smem")
    for d in args.dims:
        bd = max(16, triton.next_power_of_2(d))
        for variant in args.variants:
            flags = {f: f in _VARIANTS[variant] for f in _FLAGS}
            base = dict(Dk=d, Dv=d, BLOCK_DK=bd, BLOCK_DV=bd, COUNT_VISITS=False, **flags,
                        PRECISION="ieee" if args.dtype == "fp32" else "tf32")
            for name, kernel, table, big, small in kernels:
                for b, s, w, st, dmin, dmax in table:
                    if not dmin <= bd <= dmax:
                        continue
                    consts = dict(base, **{big: b, small: s, "DMIN": dmin, "DMAX": dmax})
                    if name != "fwd":  # the backward kernels take neither (sinks: the LSE)
                        consts = {c: x for c, x in consts.items()
                                  if c not in ("HAS_SINKS", "COUNT_VISITS")}
                    regs, stack, smem = resources(compile_sm90(kernel, consts, args.dtype, w,
                                                               st))
                    tile = f"{big[-1]}{b}x{small[-1]}{s}"
                    print(f"{name:6}  {d:<4} {variant:8} {tile:13} "
                          f"{w:5} {st:6} {regs:5} {stack:6} {smem:6}", flush=True)


if __name__ == "__main__":
    main()
