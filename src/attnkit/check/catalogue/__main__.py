"""``python -m attnkit.check.catalogue --write-docs [PATH]``: write the reference page of the
codes (default ``docs/check-codes.md``, from the repository's root); without it, print it."""

from __future__ import annotations

import argparse
from pathlib import Path

from .docs import PAGE, page


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m attnkit.check.catalogue",
                                     description=__doc__)
    parser.add_argument("--write-docs", nargs="?", const=PAGE, metavar="PATH",
                        help=f"write the page to PATH (default {PAGE})")
    args = parser.parse_args(argv)
    text = page()
    if args.write_docs is None:
        print(text, end="")
        return 0
    Path(args.write_docs).write_text(text, encoding="utf-8")
    print(f"wrote {args.write_docs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
