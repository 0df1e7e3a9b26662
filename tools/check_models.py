"""The acceptance matrix of ``attnkit check model`` (``make test-models``): every architecture
of :mod:`attnkit.check.model.zoo` built from a tiny random config, checked with eager, SDPA
and attnkit in float32, bfloat16 and float16, padded left, right and not at all, with two
decoding steps where it has a language-model head (the check's own loop and the
model's generate() with a dynamic and a static cache), and with packed documents (position ids
that restart) where the zoo marks it. Prints one row per architecture; a cell is ``ok``
(no error finding), the codes found, or why nothing was judged. Exits 1 when any cell is
not ``ok`` (an architecture the installed transformers lacks is ``-``, not a failure).

    python tools/check_models.py                      # the whole matrix (~10-20 min on 2 cores)
    python tools/check_models.py --archs llama,bert --dtypes float32 --paddings left
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

DTYPES = ("float32", "bfloat16", "float16")
PADDINGS = ("left", "right", "none")
IMPLEMENTATIONS = ("eager", "sdpa", "attnkit")


def cell(report) -> str:
    """``ok``, the error codes found, or why the run is not a pass, in a few words."""
    if report.ok:
        return "ok"
    errors = sorted({f.code for r in report.implementations for f in r.findings
                     if f.is_error})
    if errors:
        return ",".join(errors)
    return (report.reason or "nothing judged")[:60]


def check_one(model, arch, padding: str | None) -> str:
    from attnkit.check import check_model

    generate = 2 if arch.head else 0
    try:
        if padding == "packed":
            import torch

            ids = torch.randint(1, 64, (1, 12), generator=torch.Generator().manual_seed(0))
            pos = torch.cat([torch.arange(5), torch.arange(7)])[None]
            report = check_model(model, {"input_ids": ids, "position_ids": pos},
                                 implementations=list(IMPLEMENTATIONS), progress=False)
        else:
            report = check_model(model, implementations=list(IMPLEMENTATIONS),
                                 generate=generate, padding=padding or "none",
                                 progress=False, generate_api=True)
    except Exception as err:  # the matrix reports, it never stops
        return f"raised {type(err).__name__}: {str(err)[:50]}"
    return cell(report)


def main(argv: list[str] | None = None) -> int:
    from attnkit.check.model.zoo import ARCHITECTURES, zoo_model

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--archs", default=",".join(ARCHITECTURES))
    p.add_argument("--dtypes", default=",".join(DTYPES))
    p.add_argument("--paddings", default=",".join(PADDINGS))
    p.add_argument("--threads", type=int, default=1,
                   help="torch intra-op threads (tiny models: 1 is fastest)")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    archs = [a for a in args.archs.split(",") if a]
    dtypes = [d for d in args.dtypes.split(",") if d]
    paddings = [x for x in args.paddings.split(",") if x]
    warnings.simplefilter("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    columns = [f"{d} {x}" for d in dtypes for x in paddings] + ["packed"]
    print(f"attnkit check model acceptance matrix: transformers {transformers.__version__}, "
          f"implementations {', '.join(IMPLEMENTATIONS)}, two decoding steps where the "
          f"model has a head")
    print("| architecture | " + " | ".join(columns) + " | seconds |")
    print("|---" * (len(columns) + 2) + "|")
    failed = total = 0
    t_all = time.perf_counter()
    for name in archs:
        arch = ARCHITECTURES[name]
        t0 = time.perf_counter()
        cells = []
        for dtype in dtypes:
            try:
                model = zoo_model(name, dtype)
            except LookupError:
                cells += ["-"] * len(paddings)
                continue
            except Exception as err:
                cells += [f"build failed: {type(err).__name__}"] * len(paddings)
                continue
            takes_padding = getattr(model, "main_input_name", "input_ids") == "input_ids"
            for padding in paddings:
                if not takes_padding and padding != paddings[0]:
                    cells.append("n/a")  # images and sounds: no padding to vary
                    continue
                cells.append(check_one(model, arch, padding if takes_padding else None))
        if arch.packed and "float32" in dtypes:
            cells.append(check_one(zoo_model(name, "float32"), arch, "packed"))
        else:
            cells.append("")
        judged = [c for c in cells if c not in ("-", "n/a", "")]
        total += len(judged)
        failed += sum(c != "ok" for c in judged)
        print(f"| {name} | " + " | ".join(cells) + f" | {time.perf_counter() - t0:.0f} |",
              flush=True)
    print(f"\n{total - failed} of {total} cells ok, {failed} not; "
          f"{time.perf_counter() - t_all:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
