"""The ``attnkit`` command: a thin front door over the library.

::

    attnkit demo  [--out DIR]                       how attention works, as figures (NumPy only)
    attnkit train [--task reverse|copy|sort] [--model additive|mha] [--steps N] [--out DIR]
    attnkit trace [--embed-dim E --num-heads H --batch-size B --seq-len T ...]
    attnkit bench [--quick | --smoke]               the scripts under benchmarks/
    attnkit view  FILE.npz | MODEL --text "..."     a standalone HTML attention explorer
    attnkit check {softmax,masked-softmax,attention,multi-head} TARGET [--convention NAME]
        [--causal] [--per-query-lens] [--json] [--lang en|zh]
    attnkit check model MODEL|--tiny FAMILY [--implementations eager,sdpa,attnkit] [--generate N]

Each subcommand parses its arguments and calls library functions (:mod:`attnkit.viz.tour`,
:mod:`attnkit.viz.trace`, :mod:`attnkit.viz.view`, :mod:`attnkit.seq2seq`,
:mod:`attnkit.bench`, :mod:`attnkit.check`); bad arguments end in one argparse error line that
names the flag, and exit code 2. A concept has one spelling in every subcommand (``--num-heads``,
``--batch-size``, ``--seq-len``); the old spellings still work, hidden from ``--help``,
with a warning.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from attnkit.train_config import MODELS, TASKS, TrainConfig
from attnkit.viz.view import add_view_arguments, run_view

__all__ = ["build_parser", "main"]


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


# -- options: one spelling per concept, errors that name the flag --------------------------
class _DeprecatedAlias(argparse.Action):
    """An old spelling of an option: still accepted, hidden from ``--help``, warned about."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, default=argparse.SUPPRESS,
                         help=argparse.SUPPRESS, **kwargs)
        self.new = new

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog}: warning: {option_string} is deprecated; use {self.new}",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def _option(parser: argparse.ArgumentParser, flag: str, *old: str, **kwargs: Any) -> None:
    """``parser.add_argument(flag, **kwargs)``, plus each ``old`` spelling as an alias.
    ``--help`` shows ``flag``'s own name as its metavar unless one is given."""
    if kwargs.get("action") is None:
        kwargs.setdefault("metavar", flag.lstrip("-").replace("-", "_").upper())
    action = parser.add_argument(flag, **kwargs)
    for name in old:
        parser.add_argument(name, dest=action.dest, type=action.type, metavar=action.metavar,
                            action=_DeprecatedAlias, new=flag)


def _flag_error(parser: argparse.ArgumentParser, message: str) -> NoReturn:
    """``parser.error(message)`` for a library error, with each parameter it names as
    ``name=value`` or as a ``snake_case`` identifier replaced by the flag that sets it:
    ``hidden=30 ... num_heads=4`` -> ``--hidden 30 ... --num-heads 4``, ``pass head_dim`` ->
    ``pass --head-dim``. The flag of a parameter is the option whose ``dest`` it is."""
    flags = {a.dest: a.option_strings[-1] for a in parser._actions
             if a.option_strings and a.default is not argparse.SUPPRESS}

    def to_flag(match: re.Match[str]) -> str:
        name, equals = match.group(1), match.group(2)
        if name not in flags or not (equals or "_" in name):
            return match.group(0)
        return flags[name] + (" " if equals else "")

    parser.error(re.sub(r"(?<![\w-])([A-Za-z_]\w*)(=?)", to_flag, message))


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
    print(f"demo: {len(written)} files in {args.out} ({time.perf_counter() - t0:.1f} s)")
    return 0


def cmd_trace(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from attnkit.viz.trace import trace_shapes

    try:
        trace_shapes(
            embed_dim=args.embed_dim, num_heads=args.num_heads, batch=args.batch,
            seq=args.seq, kv_seq=args.kv_seq, head_dim=args.head_dim,
            num_kv_heads=args.num_kv_heads, seed=args.seed,
        )
    except ValueError as err:  # sizes that do not fit together: an argument error
        _flag_error(parser, str(err))
    return 0


def cmd_train(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    # TrainConfig checks the values without torch, so a bad argument costs no torch import.
    try:
        config = TrainConfig(**{key: getattr(args, key) for key in TRAIN_DEFAULTS})
    except ValueError as err:
        _flag_error(parser, str(err))
    _check_out(args.out, parser)
    try:
        from tqdm import tqdm

        from attnkit import seq2seq
    except ImportError as err:
        return _missing("attnkit train", "torch", err)
    print(f"training {config.task} (length {config.length}) with {config.model} attention: "
          f"{config.steps} steps of {config.batch_size}, seed {config.seed}, "
          f"{config.threads} thread{'s' if config.threads > 1 else ''}", flush=True)
    # tqdm on stderr: redrawn in place on a terminal; stdout keeps only the results.
    with tqdm(total=config.steps, desc="train", unit="step", file=sys.stderr,
              mininterval=0.5) as bar:
        def progress(step: int, loss: float) -> None:
            bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            bar.update(step - bar.n)

        result = seq2seq.train(config, progress=progress)
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
    _write_explorer(result, args.out)
    print(f"exact-match accuracy: {result.accuracy:.3f}")
    return 0


def _write_explorer(result: Any, out: str) -> None:
    """One explorer page of the trained model's cross-attention on a held-out example."""
    from attnkit.viz import explore

    src = [str(d) for d in result.eval_src[0].tolist()]
    pred = [str(d) for d in result.eval_pred[0].tolist()]
    path = os.path.join(out, f"explore_{result.config.task}_{result.config.model}.html")
    explore(result.eval_weights[0], pred, k_tokens=src,
            title=f"{result.config.task}: decoder cross-attention (trained)").save(path)
    print(f"wrote {path} (open it in a browser)")


def cmd_bench(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from attnkit import bench

    if args.dir is not None:
        folder = Path(args.dir)
        if not folder.is_dir():
            parser.error(f"--dir {folder}: no such folder")
    else:
        found = bench.find_benchmarks()
        if found is None:
            print(f"attnkit bench: error: {bench.missing_benchmarks_message()}", file=sys.stderr)
            return 1
        folder = found
    scripts = bench.select_scripts(folder, args.only)
    if not scripts:
        if args.only:
            parser.error(f"--only {' '.join(args.only)}: no script in {folder} matches")
        print(f"attnkit bench: error: no benchmark scripts in {folder}", file=sys.stderr)
        return 1
    return bench.run_benchmarks(scripts, quick=args.quick, smoke=args.smoke,
                                timeout=args.timeout)


def cmd_check(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from attnkit.check import CHECKS, Finding, Report, load_target
    from attnkit.check.catalogue import T, get_language
    from attnkit.check.meet.targets import TargetLoadError, stdout_to_stderr

    if args.causal and args.kind not in ("attention", "multi-head"):
        parser.error(T("cli.causal-kind", kind=args.kind))
    options = {"causal": True} if args.causal else {}
    if args.per_query_lens:
        if args.kind not in ("masked-softmax", "attention"):
            parser.error(T("cli.per-query-kind", kind=args.kind))
        options["per_query_lens"] = True
    # Whatever the user's code prints (at import, per call) goes to stderr: stdout carries
    # the report alone, so --json is one JSON document.
    with stdout_to_stderr():
        try:
            target = load_target(args.target)
        except (ValueError, ImportError) as err:
            parser.error(T("cli.target", target=args.target,
                           error=err.args[0] if err.args else str(err)))
        except TargetLoadError as err:
            report = Report(args.kind, args.target)
            report.add(Finding("call-failed", T("load.failed", error=err.args[0]),
                               T("measured.not-loaded")))
        else:
            try:
                report = CHECKS[args.kind](target, convention=args.convention, **options)
            except (ValueError, TypeError) as err:  # a convention the check does not take
                parser.error(err.args[0] if err.args else str(err))
    lang = args.lang or get_language()
    print(report.to_json(lang) if args.json else report.text(lang))
    return 0 if report.ok else 1


# -- parser ----------------------------------------------------------------------------------
class _Parser(argparse.ArgumentParser):
    """argparse, with an argument error reported as exactly one line (exit code 2), in the
    parser's language (``attnkit check``: the report's)."""

    lang = "en"

    def error(self, message: str) -> NoReturn:
        if self.lang != "en":
            from attnkit.check.catalogue.command import error_line

            self.exit(2, error_line(self.prog, message, self.lang))
        self.exit(2, f"{self.prog}: error: {message} (see: {self.prog} --help)\n")


# The defaults of `attnkit train` are TrainConfig's own (attnkit.train_config: no torch).
TRAIN_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(TrainConfig)}


def build_parser(lang: str = "en") -> argparse.ArgumentParser:
    """The parser of ``attnkit``; ``lang``: the language of ``attnkit check``'s help and
    usage errors (``"en"`` or ``"zh"``)."""
    parser = _Parser(
        prog="attnkit",
        description="attnkit: attention building blocks, shown at work.",
    )
    from attnkit import __version__

    parser.add_argument("--version", action="version", version=f"attnkit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = sub.add_parser(
        "demo", help="walk through softmax, masks, additive/dot/multi-head attention (PNGs)",
        description="Walk through how attention works with the NumPy reference and write "
                    "one PNG per step: naive vs stable softmax, masked softmax, additive vs "
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
    train.add_argument("--task", choices=TASKS, default=TRAIN_DEFAULTS["task"],
                       help="reverse, copy or sort the digits (default: %(default)s)")
    train.add_argument("--model", choices=MODELS, default=TRAIN_DEFAULTS["model"],
                       help="the decoder's attention (default: %(default)s)")
    # Every numeric option sets the TrainConfig field `key`, and defaults to its default.
    for flag, old, key, kind, what in (
        ("--steps", (), "steps", positive_int, "optimiser steps"),
        ("--seq-len", ("--length",), "length", positive_int, "T: digits per sequence"),
        ("--batch-size", (), "batch_size", positive_int, "sequences per step"),
        ("--hidden", (), "hidden", positive_int, "model width"),
        ("--num-heads", ("--heads",), "num_heads", positive_int, "heads of the mha model"),
        ("--lr", (), "lr", positive_float, "Adam learning rate"),
        ("--seed", (), "seed", non_negative_int, "random seed"),
        ("--eval-size", (), "eval_size", positive_int, "held-out sequences"),
        ("--threads", (), "threads", positive_int, "torch CPU threads"),
    ):
        _option(train, flag, *old, dest=key, type=kind, default=TRAIN_DEFAULTS[key],
                help=f"{what} (default: %(default)s)")
    train.add_argument("--out", default="attnkit-out",
                       help="folder for the heatmap (default: %(default)s)")
    train.set_defaults(func=cmd_train)

    trace = sub.add_parser(
        "trace", help="print the shape of every step of a multi-head attention",
        description="Run one multi-head attention (NumPy reference) and print the shape of "
                    "every step with its symbolic name. Defaults: batch 3, length 11, 5 heads "
                    "of 7.",
    )
    # Each option sets the attnkit.viz.trace.trace_shapes parameter named by its dest.
    for flag, old, dest, symbol, default, what in (
        ("--embed-dim", (), "embed_dim", "E", 35, "E (default: 35)"),
        ("--num-heads", (), "num_heads", "H", 5, "H (default: 5)"),
        ("--batch-size", ("--batch",), "batch", "B", 3, "B (default: 3)"),
        ("--seq-len", ("--seq",), "seq", "Tq", 11, "Tq (default: 11)"),
        ("--kv-seq-len", ("--kv-seq",), "kv_seq", "Tk", None,
         "Tk for cross-attention (default: self-attention)"),
        ("--head-dim", (), "head_dim", "D", None, "Dk = Dv (default: E // H)"),
        ("--kv-heads", (), "num_kv_heads", "Hkv", None,
         "Hkv for grouped-query attention (default: H)"),
    ):
        _option(trace, flag, *old, dest=dest, metavar=symbol, type=positive_int,
                default=default, help=what)
    _option(trace, "--seed", type=non_negative_int, default=0, help="random seed")
    trace.set_defaults(func=cmd_trace)

    bench = sub.add_parser(
        "bench", help="run the benchmark scripts and print their tables",
        description="Run every script under the benchmarks/ folder of attnkit's source "
                    "repository with this interpreter (the scripts are not part of a pip "
                    "install: run from a clone, or pass --dir). --quick: small sizes, "
                    "nothing recorded. A script whose extra is not "
                    "installed is skipped with one line naming it. Exits non-zero when a "
                    "script fails.",
    )
    size = bench.add_mutually_exclusive_group()
    size.add_argument("--quick", action="store_true", help="small sizes, nothing recorded")
    size.add_argument("--smoke", action="store_true",
                      help="the smallest sizes, one round, nothing recorded: checks that "
                           "every script runs (its numbers mean nothing)")
    bench.add_argument("--dir", default=None, help="benchmark folder (default: the repo's)")
    bench.add_argument("--only", nargs="+", metavar="NAME", default=None,
                       help="run only scripts whose file name contains NAME")
    bench.add_argument("--timeout", type=positive_float, default=600.0,
                       help="seconds per script before it is killed (default: 600)")
    bench.set_defaults(func=cmd_bench)

    view = sub.add_parser(
        "view", help="write a standalone HTML attention explorer (.npz, or a model with --text)",
        description="Write one self-contained HTML page (no network, no server) that shows "
                    "attention weights per layer and head: saved weights from a .npz file, or "
                    "a transformers model (config folder or checkpoint) run on --text.",
    )
    add_view_arguments(view)
    view.set_defaults(func=run_view)

    _add_check(sub, lang)
    return parser


def _add_check(sub: Any, lang: str) -> None:
    """``attnkit check``: its help and errors in ``lang`` (the words: the catalogue's)."""
    from attnkit.check.catalogue.command import LANGUAGES, help_words, localize

    h = help_words(lang)
    check = sub.add_parser("check", help=help_words("en")("help.check"),
                           description=h("help.check.description"))
    check.add_argument("kind", choices=("softmax", "masked-softmax", "attention", "multi-head"),
                       help=h("help.check.kind"))
    check.add_argument("target", metavar="TARGET", help=h("help.check.target"))
    check.add_argument("--convention", default="auto",
                       choices=("auto", "valid_lens", "masked", "keep", "sdpa", "additive",
                                "none"),
                       help=h("help.check.convention"))
    check.add_argument("--causal", action="store_true", help=h("help.check.causal"))
    check.add_argument("--per-query-lens", action="store_true",
                       help=h("help.check.per-query-lens"))
    check.add_argument("--json", action="store_true", help=h("help.json"))
    check.add_argument("--lang", choices=LANGUAGES, default=None, help=h("help.lang"))
    check.set_defaults(func=cmd_check)
    check.epilog = h("help.check.epilog", help="attnkit check model --help",
                     usage="attnkit check model MODEL|--tiny FAMILY [--implementations "
                           "eager,sdpa,attnkit] [--generate N] ...")
    localize(check, lang)


# -- attnkit check model (its arguments are not a function check's: its own parser) ---------
def cmd_check_model(argv: Sequence[str], lang: str = "en") -> int:
    from attnkit.check.catalogue.command import localize
    from attnkit.check.model import command as model_command

    parser = _Parser(prog="attnkit check model", description=model_command.description(lang))
    model_command.add_arguments(parser, positive_int, non_negative_int, lang)
    localize(parser, lang)
    return model_command.run(parser.parse_args(argv), parser)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``attnkit`` and ``python -m attnkit``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    lang = "en"  # of attnkit check's help and errors: its --lang, else $ATTNKIT_LANG
    if argv[:1] == ["check"]:
        from attnkit.check.catalogue.command import command_language
        lang = command_language(argv)
    if argv[:2] == ["check", "model"]:
        return cmd_check_model(argv[2:], lang)
    parser = build_parser(lang)
    args = parser.parse_args(argv)
    sub = parser._subparsers._group_actions[0].choices[args.command]  # type: ignore[union-attr]
    return args.func(args, sub)


if __name__ == "__main__":
    raise SystemExit(main())
