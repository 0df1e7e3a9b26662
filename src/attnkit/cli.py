"""The ``attnkit`` command: a thin front door over the library.

::

    attnkit demo  [--out DIR]                       the seed notes, as figures (NumPy only)
    attnkit train [--task reverse|copy|sort] [--model additive|mha] [--steps N] [--out DIR]
    attnkit trace [--embed-dim E --num-heads H --batch B --seq T ...]
    attnkit bench [--quick]                         the scripts under benchmarks/

Each subcommand parses its arguments and calls library functions (:mod:`attnkit.viz.tour`,
:mod:`attnkit.seq2seq`); bad arguments end in one argparse error line and exit code 2.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn, TextIO

__all__ = ["Progress", "build_parser", "find_benchmarks", "main"]


# -- argument types: each rejects a bad value with one line ---------------------------------
def _int_at_least(text: str, low: int, expected: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {expected}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and value != float("inf")):
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


# -- progress bar ----------------------------------------------------------------------------
class Progress:
    """A one-line progress report: steps, loss, rate, time left.

    On a terminal the line is redrawn in place (``\\r``) at most ten times a second; into a
    file or pipe it prints about ``lines`` plain lines over the run, so logs stay short.
    """

    def __init__(self, total: int, *, stream: TextIO | None = None, lines: int = 10,
                 width: int = 24) -> None:
        self.total = total
        self.stream = sys.stdout if stream is None else stream
        isatty = getattr(self.stream, "isatty", None)
        self.tty = bool(isatty and isatty())
        self.every = max(1, total // max(1, lines))
        self.width = width
        self.first: tuple[int, float] | None = None  # (step, time) of the first update
        self.last_draw = 0.0
        self.drawn = False

    def line(self, step: int, loss: float) -> str:
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now)
        # The rate counts from the first report on, so set-up time does not dilute it.
        done, elapsed = step - self.first[0], now - self.first[1]
        rate = done / elapsed if done > 0 and elapsed > 0 else 0.0
        eta = f"{(self.total - step) / rate:.0f}s" if rate > 0 else "?"
        filled = int(self.width * step / self.total)
        bar = "#" * filled + "." * (self.width - filled)
        digits = len(str(self.total))
        return (f"step {step:>{digits}}/{self.total} [{bar}] loss {loss:.4f}  "
                f"{rate:.1f} steps/s  eta {eta}")

    def update(self, step: int, loss: float) -> None:
        now = time.perf_counter()
        if self.first is None:
            self.first = (step, now)
        if self.tty:
            if step == self.total or now - self.last_draw >= 0.1:
                self.stream.write("\r" + self.line(step, loss) + "\x1b[K")
                self.stream.flush()
                self.last_draw, self.drawn = now, True
        elif step % self.every == 0 or step == self.total:
            self.stream.write(self.line(step, loss) + "\n")
            self.stream.flush()

    def close(self) -> None:
        if self.tty and self.drawn:
            self.stream.write("\n")
            self.stream.flush()


# -- subcommands -----------------------------------------------------------------------------
def _missing(what: str, extra: str, err: ImportError) -> int:
    print(f"attnkit: error: {what} needs {err.name}; install it with "
          f"pip install 'attnkit[{extra}]'", file=sys.stderr)
    return 1


def _check_out(folder: str, parser: argparse.ArgumentParser) -> None:
    """Create ``--out`` now: a folder that cannot be written is an argument error, found
    before the work whose figures it would hold, not a traceback after it."""
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError as err:
        parser.error(f"--out {folder}: {err.strerror or err}")
    if not os.access(folder, os.W_OK):
        parser.error(f"--out {folder}: not writable")


def cmd_demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    _check_out(args.out, parser)
    try:
        from attnkit.viz.tour import run_demo
    except ImportError as err:
        return _missing("attnkit demo", "viz", err)
    t0 = time.perf_counter()
    written = run_demo(args.out, seed=args.seed)
    print(f"demo: {len(written)} figures in {args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from attnkit.viz.trace import trace_shapes

    try:
        trace_shapes(
            embed_dim=args.embed_dim, num_heads=args.num_heads, batch=args.batch,
            seq=args.seq, kv_seq=args.kv_seq, head_dim=args.head_dim,
            num_kv_heads=args.kv_heads, seed=args.seed,
        )
    except ValueError as err:  # sizes that do not fit together: an argument error
        parser.error(str(err))
    return 0


def cmd_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    try:
        from attnkit import seq2seq
    except ImportError as err:
        return _missing("attnkit train", "torch", err)
    try:
        config = seq2seq.TrainConfig(
            task=args.task, model=args.model, steps=args.steps, length=args.length,
            batch_size=args.batch_size, hidden=args.hidden, num_heads=args.heads, lr=args.lr,
            seed=args.seed, eval_size=args.eval_size, threads=args.threads,
        )
    except ValueError as err:
        parser.error(str(err))
    _check_out(args.out, parser)
    print(f"training {config.task} (length {config.length}) with {config.model} attention: "
          f"{config.steps} steps of {config.batch_size}, seed {config.seed}, "
          f"{config.threads} thread{'s' if config.threads > 1 else ''}")
    bar = Progress(config.steps)
    try:
        result = seq2seq.train(config, progress=bar.update)
    finally:
        bar.close()
    print(f"trained in {result.seconds:.1f} s ({config.steps / result.seconds:.1f} steps/s), "
          f"final loss {result.losses[-1]:.4f}")
    src = " ".join(map(str, result.eval_src[0].tolist()))
    pred = " ".join(map(str, result.eval_pred[0].tolist()))
    print(f"held-out example: {src} -> {pred}")
    print(f"held-out per-digit accuracy ({config.eval_size} sequences): "
          f"{result.token_accuracy:.3f}")
    try:
        path = os.path.join(args.out, f"train_{config.task}_{config.model}.png")
        seq2seq.plot_cross_attention(result, path=path)
        print(f"wrote {path}")
    except ImportError as err:
        print(f"attnkit: no heatmap written: {err.name} is not installed", file=sys.stderr)
    print(f"exact-match accuracy: {result.accuracy:.3f}")
    return 0


def find_benchmarks() -> Path | None:
    """The ``benchmarks/`` folder of a source checkout (``<repo>/src/attnkit`` ->
    ``<repo>/benchmarks``), else ``./benchmarks``; None when neither exists."""
    here = Path(__file__).resolve().parent
    for candidate in (here.parent.parent / "benchmarks", Path.cwd() / "benchmarks"):
        if candidate.is_dir():
            return candidate
    return None


def _run_script(script: Path, flags: list[str], timeout: float) -> tuple[int, float]:
    """Run one script with this interpreter, echoing its output line by line.

    Returns:
        ``(exit code, seconds)``; a script killed by the timeout reports exit code -9.
    """
    env = dict(os.environ)
    # The scripts import the same attnkit as this command, installed or not.
    src = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, str(script), *flags], cwd=script.parent.parent, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
    )
    timer = threading.Timer(timeout, proc.kill)
    timer.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            print(f"  {line.rstrip()}", flush=True)
        code = proc.wait()
    finally:
        timer.cancel()
    return code, time.perf_counter() - t0


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    folder = Path(args.dir) if args.dir else find_benchmarks()
    if folder is None or not folder.is_dir():
        where = args.dir or "next to the package source or in the current folder"
        print(f"attnkit bench: error: no benchmarks/ folder found ({where}); the benchmark "
              f"scripts ship with a source checkout of attnkit", file=sys.stderr)
        return 1
    scripts = sorted(p for p in folder.glob("*.py") if not p.name.startswith("_"))
    if args.only:
        scripts = [p for p in scripts if any(name in p.name for name in args.only)]
    if not scripts:
        print(f"attnkit bench: error: no benchmark scripts in {folder}", file=sys.stderr)
        return 1
    flags = ["--quick"] if args.quick else []
    failed = []
    for script in scripts:
        print(f"== {script.name} {' '.join(flags)}", flush=True)
        code, seconds = _run_script(script, flags, args.timeout)
        status = "ok" if code == 0 else (
            f"TIMED OUT after {args.timeout:.0f} s" if code == -9 else f"FAILED (exit {code})"
        )
        print(f"== {script.name}: {status} in {seconds:.1f} s", flush=True)
        if code != 0:
            failed.append(script.name)
    ok = len(scripts) - len(failed)
    summary = f"bench: {ok}/{len(scripts)} scripts ok"
    if failed:
        summary += f"; failed: {', '.join(failed)}"
    print(summary)
    return 1 if failed else 0


# -- parser ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, with an argument error reported as exactly one line (exit code 2)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


# The defaults of `attnkit train`, kept here so that `attnkit --help` and `attnkit demo` never
# import torch; tests/cli checks they equal attnkit.seq2seq.TrainConfig's.
TRAIN_TASKS = ("reverse", "copy", "sort")
TRAIN_MODELS = ("additive", "mha")
DEFAULTS: dict[str, object] = {
    "task": "reverse", "model": "additive", "steps": 400, "length": 10, "batch_size": 64,
    "hidden": 64, "num_heads": 4, "lr": 5e-3, "seed": 0, "eval_size": 1000, "threads": 1,
}


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="attnkit",
        description="attnkit: attention building blocks, shown at work.",
    )
    from attnkit import __version__

    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo", help="walk through softmax, masks, additive/dot/multi-head attention (PNGs)",
        description="Walk through the seed notes with the NumPy reference and write one PNG "
                    "per step: naive vs stable softmax, masked softmax, additive vs "
                    "dot-product attention, multi-head attention with its shape trace, "
                    "causal/padding/window masks.",
    )
    demo.add_argument("--out", default="attnkit-out", help="folder for the figures "
                      "(default: %(default)s)")
    demo.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    demo.set_defaults(func=cmd_demo)

    train = sub.add_parser(
        "train", help="train a small encoder-decoder with attention on a synthetic task",
        description="Train a GRU encoder-decoder whose decoder attends to the encoder "
                    "states, on digit sequences (CPU, seeded). Prints progress, the held-out "
                    "exact-match accuracy (last line) and writes the learned "
                    "cross-attention heatmap.",
    )
    train.add_argument("--task", choices=TRAIN_TASKS, default=DEFAULTS["task"],
                       help="reverse, copy or sort the digits (default: %(default)s)")
    train.add_argument("--model", choices=TRAIN_MODELS, default=DEFAULTS["model"],
                       help="the decoder's attention (default: %(default)s)")
    # Every numeric option defaults to DEFAULTS[key], the copy of TrainConfig's defaults.
    for flag, key, kind, what in (
        ("--steps", "steps", positive_int, "optimiser steps"),
        ("--length", "length", positive_int, "digits per sequence"),
        ("--batch-size", "batch_size", positive_int, "sequences per step"),
        ("--hidden", "hidden", positive_int, "model width"),
        ("--heads", "num_heads", positive_int, "heads of the mha model"),
        ("--lr", "lr", positive_float, "Adam learning rate"),
        ("--seed", "seed", non_negative_int, "random seed"),
        ("--eval-size", "eval_size", positive_int, "held-out sequences"),
        ("--threads", "threads", positive_int, "torch CPU threads"),
    ):
        train.add_argument(flag, type=kind, default=DEFAULTS[key],
                           help=f"{what} (default: %(default)s)")
    train.add_argument("--out", default="attnkit-out",
                       help="folder for the heatmap (default: %(default)s)")
    train.set_defaults(func=cmd_train)

    trace = sub.add_parser(
        "trace", help="print the shape of every step of a multi-head attention",
        description="Run one multi-head attention (NumPy reference) and print the shape of "
                    "every step, like seed 001's verbose mode. Defaults are seed 001's: "
                    "batch 3, length 11, 5 heads of 7.",
    )
    trace.add_argument("--embed-dim", type=positive_int, default=35, help="E (default: 35)")
    trace.add_argument("--num-heads", type=positive_int, default=5, help="H (default: 5)")
    trace.add_argument("--batch", type=positive_int, default=3, help="B (default: 3)")
    trace.add_argument("--seq", type=positive_int, default=11, help="Tq (default: 11)")
    trace.add_argument("--kv-seq", type=positive_int, default=None,
                       help="Tk for cross-attention (default: self-attention)")
    trace.add_argument("--head-dim", type=positive_int, default=None,
                       help="Dk = Dv (default: E // H)")
    trace.add_argument("--kv-heads", type=positive_int, default=None,
                       help="Hkv for grouped-query attention (default: H)")
    trace.add_argument("--seed", type=non_negative_int, default=0, help="random seed")
    trace.set_defaults(func=cmd_trace)

    bench = sub.add_parser(
        "bench", help="run the benchmark scripts and print their tables",
        description="Run every script under the repository's benchmarks/ folder with this "
                    "interpreter. --quick: small sizes, nothing appended to BENCHMARKS.md. "
                    "Exits non-zero when a script fails.",
    )
    bench.add_argument("--quick", action="store_true", help="small sizes, no BENCHMARKS.md")
    bench.add_argument("--dir", default=None, help="benchmark folder (default: the repo's)")
    bench.add_argument("--only", nargs="+", metavar="NAME", default=None,
                       help="run only scripts whose file name contains NAME")
    bench.add_argument("--timeout", type=positive_float, default=600.0,
                       help="seconds per script before it is killed (default: 600)")
    bench.set_defaults(func=cmd_bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``attnkit`` and ``python -m attnkit``; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    return args.func(args, sub)


if __name__ == "__main__":
    raise SystemExit(main())
