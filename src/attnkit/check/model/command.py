"""``attnkit check model``: its arguments and what it runs (the parser itself, with the
one-line errors of every subcommand, comes from :mod:`attnkit.cli`)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

from ..catalogue.messages import get_language
from .load import TINY_FAMILIES, load_model, require_transformers, tiny_model

__all__ = ["DESCRIPTION", "add_arguments", "run"]

DESCRIPTION = (
    "Run a transformers model under each attention implementation and judge every attention "
    "call (prefill and, with --generate, each decoding step) against attnkit's float64 oracle "
    "on what it received, compare the mask it received with the one the config and padding "
    "call for, and show per layer where implementations part. Nothing is downloaded and no "
    "model code is run (no trust_remote_code). Exit status 1 when any finding is an error. "
    "See docs/check.md."
)


def add_arguments(p: argparse.ArgumentParser, positive_int: Callable[[str], int],
                  non_negative_int: Callable[[str], int]) -> None:
    """Add the arguments of ``attnkit check model`` to ``p``."""
    p.add_argument("model", metavar="MODEL", nargs="?", default=None,
                   help="a local model folder (from_pretrained) or a config.json (random "
                        "weights)")
    p.add_argument("--tiny", choices=TINY_FAMILIES, default=None,
                   help="instead of MODEL: a small random model of this family")
    p.add_argument("--implementations", default="eager,sdpa,attnkit", metavar="NAMES",
                   help="comma-separated attn_implementation names; differences are measured "
                        "against the first (default: %(default)s)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16", "float64"),
                   default="float32", help="the model's dtype (default: %(default)s)")
    p.add_argument("--padding", choices=("left", "right", "none"), default="left",
                   help="padding of the random inputs (default: %(default)s)")
    # --batch-size and --seq-len as in every subcommand; --batch and --length also work
    p.add_argument("--batch-size", "--batch", dest="batch", metavar="B", type=positive_int,
                   default=2, help="B of the random inputs (default: 2)")
    p.add_argument("--seq-len", "--length", dest="length", metavar="T", type=positive_int,
                   default=12, help="T of the random inputs (default: 12)")
    p.add_argument("--generate", type=non_negative_int, default=0, metavar="N",
                   help="decoding steps with a KV cache after the prefill (default: 0)")
    p.add_argument("--sample", type=positive_int, default=None, metavar="N",
                   help="judge at most N heads and N queries per call against the oracle "
                        "(large models)")
    p.add_argument("--save", default=None, metavar="DIR",
                   help="folder for the reproducers' .pt files (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--lang", choices=("en", "zh"), default=None,
                   help="the language of the report: en or zh (中文); codes are the same in "
                        "both (default: $ATTNKIT_LANG, else en)")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Load or build the model, check it, print the table (or JSON); the exit status."""
    if (args.model is None) == (args.tiny is None):
        parser.error("give MODEL (a local folder or config.json) or --tiny FAMILY, not both")
    impls = [n.strip() for n in args.implementations.split(",") if n.strip()]
    if not impls:
        parser.error("--implementations is empty")
    os.environ["HF_HUB_OFFLINE"] = "1"  # nothing is downloaded, whatever the shell says
    try:
        require_transformers()  # before anything imports torch: the install line if missing
        from .check import check_model

        model = (tiny_model(args.tiny, args.dtype) if args.tiny
                 else load_model(args.model, args.dtype))
        report = check_model(model, implementations=impls, generate=args.generate,
                             sample=args.sample, save_to=args.save, batch=args.batch,
                             length=args.length, padding=args.padding)
    except ImportError as err:  # the transformers extra is missing: the install line
        print(f"attnkit check model: error: {err}", file=sys.stderr)
        return 2
    except ValueError as err:
        parser.error(str(err))
    report.model = f"--tiny {args.tiny}" if args.tiny else args.model
    lang = args.lang or get_language()
    print(report.to_json(lang) if args.json else report.text(lang))
    return 0 if report.ok else 1
