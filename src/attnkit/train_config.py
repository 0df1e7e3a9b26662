"""The settings of one ``attnkit train`` run (:mod:`attnkit.seq2seq`), without torch.

:class:`TrainConfig` lives apart from the model so that the command line reads its defaults
and checks its values (``attnkit --help``, a bad ``attnkit train`` argument) without
importing torch. :mod:`attnkit.seq2seq` re-exports everything here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["MODELS", "NUM_DIGITS", "TASKS", "TrainConfig"]

TASKS = ("reverse", "copy", "sort")
MODELS = ("additive", "mha")
NUM_DIGITS = 10


@dataclass
class TrainConfig:
    """Everything a training run depends on (the run is a pure function of it).

    Errors name a field as ``name=value``; ``attnkit train`` turns that into its flag.
    """

    task: str = "reverse"  # one of TASKS
    model: str = "additive"  # one of MODELS: the decoder's cross-attention
    steps: int = 400  # optimiser steps, one fresh batch each
    length: int = 10  # T: digits per sequence
    batch_size: int = 64  # sequences per step
    hidden: int = 64  # Hd: GRU width (embeddings are Hd wide too)
    num_heads: int = 4  # heads of the mha model (Hd % num_heads == 0)
    lr: float = 5e-3  # Adam learning rate, cosine-decayed to 10% over the run
    seed: int = 0  # seeds torch and the data generators
    eval_size: int = 1000  # held-out sequences for the final accuracy
    threads: int = 1  # torch CPU threads (see train(): 1 is fastest for these sizes)

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task={self.task!r} must be one of {TASKS}")
        if self.model not in MODELS:
            raise ValueError(f"model={self.model!r} must be one of {MODELS}")
        for name in ("steps", "length", "batch_size", "hidden", "num_heads", "eval_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be >= 1")
        if self.model == "mha" and self.hidden % self.num_heads:
            raise ValueError(
                f"hidden={self.hidden} must be a multiple of num_heads={self.num_heads}"
            )
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr={self.lr} must be a positive number")
        if self.threads < 1:
            raise ValueError(f"threads={self.threads} must be >= 1")
        if 2 * self.eval_size > NUM_DIGITS**self.length:
            raise ValueError(
                f"length={self.length} allows only {NUM_DIGITS**self.length} sequences: "
                f"holding out eval_size={self.eval_size} would leave too few to train on"
            )
