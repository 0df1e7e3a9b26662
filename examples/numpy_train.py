"""Train a one-layer attention model to reverse 8 digits, in pure NumPy.

    PYTHONPATH=src python examples/numpy_train.py [--steps 600] [--seed 0] [--out PATH]

Embedding + multi-head self-attention + linear head; every gradient is attnkit's
hand-written backward. Writes an .npz with ``loss`` (steps,), ``accuracy``, ``attention``
(H, T, T) on a held-out example and that example's ``tokens`` (T,), for plotting.
"""

from __future__ import annotations

import argparse
import os

from attnkit.numpy.train import ReverseConfig, train_reverse


def main() -> None:
    defaults = ReverseConfig()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=defaults.steps)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--heads", type=int, default=defaults.num_heads)
    parser.add_argument("--out", default="attnkit-out/numpy_train.npz")
    args = parser.parse_args()

    result = train_reverse(steps=args.steps, seed=args.seed, num_heads=args.heads)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    result.save(args.out)
    print(f"saved loss curve and attention maps to {args.out}")


if __name__ == "__main__":
    main()
