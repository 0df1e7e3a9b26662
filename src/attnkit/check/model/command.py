"""``attnkit check model``: its arguments and what it runs (the parser itself, with the
one-line errors of every subcommand, comes from :mod:`attnkit.cli`)."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

from ..catalogue import LANGUAGES, T, get_language, render
from ..catalogue.command import help_words
from .any_command import (
    cast_inputs,
    is_target_spec,
    load_any_model,
    load_implementation,
    read_inputs,
)
from .load import TINY_FAMILIES, load_model, require_transformers, tiny_model

__all__ = ["add_arguments", "description", "run"]

def description(lang: str = "en") -> str:
    """What ``attnkit check model --help`` says it does, in ``lang``."""
    return help_words(lang)("help.model.description")


def add_arguments(p: argparse.ArgumentParser, positive_int: Callable[[str], int],
                  non_negative_int: Callable[[str], int], lang: str = "en") -> None:
    """Add the arguments of ``attnkit check model`` to ``p``, their help in ``lang``."""
    h = help_words(lang)
    p.add_argument("model", metavar="MODEL", nargs="?", default=None, help=h("help.model.model"))
    p.add_argument("--tiny", choices=TINY_FAMILIES, default=None, help=h("help.model.tiny"))
    p.add_argument("--implementations", default="eager,sdpa,attnkit", metavar="NAMES",
                   help=h("help.model.implementations"))
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                   default=None, help=h("help.model.dtype"))
    p.add_argument("--implementation", default=None, metavar="FILE.py:FN",
                   help=h("help.model.implementation"))
    p.add_argument("--layers", default=None, metavar="PATTERNS", help=h("help.model.layers"))
    p.add_argument("--inputs", default=None, metavar="FILE", help=h("help.model.inputs"))
    p.add_argument("--seed", type=non_negative_int, default=0, help=h("help.model.seed"))
    p.add_argument("--padding", choices=("left", "right", "none"), default="left",
                   help=h("help.model.padding"))
    # --batch-size and --seq-len as in every subcommand; --batch and --length also work
    p.add_argument("--batch-size", "--batch", dest="batch", metavar="B", type=positive_int,
                   default=2, help=h("help.model.batch"))
    p.add_argument("--seq-len", "--length", dest="length", metavar="T", type=positive_int,
                   default=12, help=h("help.model.length"))
    p.add_argument("--generate", type=non_negative_int, default=0, metavar="N",
                   help=h("help.model.generate"))
    p.add_argument("--generate-api", action="store_true", help=h("help.model.generate-api"))
    p.add_argument("--sample", type=positive_int, default=None, metavar="N",
                   help=h("help.model.sample"))
    p.add_argument("--save", default=None, metavar="DIR", help=h("help.model.save"))
    p.add_argument("--json", action="store_true", help=h("help.json"))
    p.add_argument("--lang", choices=LANGUAGES, default=None, help=h("help.lang"))


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Load or build the model, check it, print the table (or JSON); the exit status."""
    lang = args.lang or get_language()

    def refuse(text: Any) -> NoReturn:  # a usage error, in the report's language
        parser.error(render(text, lang))

    if (args.model is None) == (args.tiny is None):
        refuse(T("cmd.model-or-tiny"))
    impls = [n.strip() for n in args.implementations.split(",") if n.strip()]
    if not impls:
        refuse(T("cmd.no-implementations"))
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded, whatever the shell says
    if args.layers and not args.implementation:
        refuse(T("cmd.layers"))
    try:
        if args.model is not None and is_target_spec(args.model):
            if args.generate or args.sample or args.implementations != "eager,sdpa,attnkit":
                refuse(T("cmd.transformers-only"))
            report = _run_any(args)
        else:
            report = _run_transformers(args, impls)
    except ImportError as err:  # the transformers extra is missing: the install line
        print(render(T("cli.error-only", prog=parser.prog, message=_missing(err)), lang),
              file=sys.stderr)
        return 2
    except ValueError as err:  # one line, in the report's language where the catalogue has it
        refuse(err.args[0] if err.args else str(err))
    print(report.to_json(lang) if args.json else report.text(lang))
    return 0 if report.ok else 1


def _missing(err: ImportError) -> Any:
    """The install line of a missing extra as a sentence (any other error as written)."""
    m = re.fullmatch(r"(.+) needs (\w+), which is not installed: (.+)", str(err))
    return T("cli.missing", user=m[1], module=m[2], install=m[3]) if m else str(err)


def _implementation(args: argparse.Namespace) -> Any:
    if not args.implementation:
        return None
    fn = load_implementation(args.implementation)
    if not args.layers:
        return fn
    return {p.strip(): fn for p in args.layers.split(",") if p.strip()}


def _run_any(args: argparse.Namespace) -> Any:
    """A model from FILE.py:NAME, judged call by call."""
    import torch

    from .any_model import check_any_model

    implementation = _implementation(args)
    model, inputs = load_any_model(args.model, args.seed)
    if args.inputs:
        inputs = read_inputs(args.inputs)
    if args.dtype:
        model = model.to(getattr(torch, args.dtype))
        inputs = cast_inputs(inputs, getattr(torch, args.dtype))
    if inputs is None:
        raise ValueError(T("cmd.no-inputs", spec=repr(args.model), model=args.model))
    return check_any_model(model, inputs, implementation=implementation,
                           save_to=args.save, label=args.model)


def _run_transformers(args: argparse.Namespace, impls: list[str]) -> Any:
    require_transformers()  # before anything imports torch: the install line if missing
    from .check import check_model

    dtype = args.dtype or "float32"
    model = (tiny_model(args.tiny, dtype, seed=args.seed) if args.tiny
             else load_model(args.model, dtype, seed=args.seed))
    inputs = read_inputs(args.inputs) if args.inputs else None
    report = check_model(model, inputs, implementations=impls, generate=args.generate,
                         sample=args.sample, save_to=args.save, batch=args.batch,
                         length=args.length, padding=args.padding, seed=args.seed,
                         implementation=_implementation(args),
                         generate_api=args.generate_api)
    report.model = f"--tiny {args.tiny}" if args.tiny else args.model
    return report
