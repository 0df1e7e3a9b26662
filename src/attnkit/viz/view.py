"""``attnkit view``: the explorer page of saved weights (``.npz``) or of a model run on text.

The command's logic, apart from ``attnkit.cli`` so that the CLI only wires it::

    view = sub.add_parser("view", ...)
    add_view_arguments(view)
    view.set_defaults(func=run_view)       # run_view(args, parser) -> exit code

``python -m attnkit.viz.view`` runs the same command on its own (:func:`view_main`).
A model is read through a :data:`ModelLoader`; by default
``attnkit.integrations.transformers.attentions_for_text``, when that front end is installed.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from .explorer import DEFAULT_MAX_BYTES, PRECISIONS, PathLike, explore, load_npz

__all__ = [
    "ModelLoader", "add_view_arguments", "model_structure", "run_view", "view_file", "view_main",
]

ModelLoader = Callable[[str, str], tuple[Any, ...]]
"""``loader(model_name_or_path, text) -> (attentions, tokens)`` or ``(attentions, tokens,
structure)``: what ``attnkit view MODEL`` calls. ``attentions`` is anything
:func:`~attnkit.viz.explorer.explore` takes, e.g. a transformers model's
``output_attentions`` (a tuple of ``(B, H, T, T)``, one per layer); ``structure`` is a
dict of :func:`explore` options that the model's attention had: ``mask`` (True = may
attend, e.g. causal) and ``kv_heads``."""


def _default_model_loader() -> ModelLoader:
    """``attnkit.integrations.transformers.attentions_for_text``, when that front end is
    installed, with the structure read from the model's config (:func:`model_structure`)."""
    try:
        mod = importlib.import_module("attnkit.integrations.transformers")
        attentions_for_text = mod.attentions_for_text
    except (ImportError, AttributeError) as err:
        raise ValueError(
            "viewing a model needs attnkit's transformers front end "
            f"(attnkit.integrations.transformers.attentions_for_text: {err}); "
            "save the weights with Explorer.save_npz and view the .npz instead"
        ) from None

    def loader(model: str, text: str) -> tuple[Any, Sequence[str], dict[str, Any]]:
        attentions, tokens = attentions_for_text(model, text)
        return attentions, tokens, model_structure(model, attentions)

    return loader


def _is_causal(config: Any) -> bool:
    """Whether a transformers model of this config masks future keys (decoder-only)."""
    if getattr(config, "is_encoder_decoder", False):
        return False  # attnkit view draws the encoder
    if getattr(config, "is_decoder", False):
        return True
    from transformers.models.auto import modeling_auto as auto

    kind = getattr(config, "model_type", None)
    return (kind in auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
            and kind not in auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES)


def model_structure(model: str, attentions: Sequence[Any]) -> dict[str, Any]:
    """What a transformers model's attention may see, from its config: ``kv_heads`` (its
    ``num_key_value_heads``, when fewer than its query heads) and ``mask`` ``(L, 1, T, T)``
    (True = may attend): causal for a decoder-only model, narrowed to the sliding window on
    the layers that have one.

    The mask is only returned when the weights agree with it (every cell it excludes has
    weight exactly 0, as attnkit's attention gives): a config read wrong draws no stripes
    rather than false ones. Empty when the config cannot be read.
    """
    try:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model)
    except Exception:  # noqa: BLE001  (no config: nothing to add, the page still works)
        return {}
    config = getattr(config, "get_text_config", lambda: config)()
    weights = [np.asarray(a.detach().cpu().float() if hasattr(a, "detach") else a)
               for a in attentions]
    L, (H, Tq, Tk) = len(weights), weights[0].shape[-3:]
    structure: dict[str, Any] = {}
    kv = getattr(config, "num_key_value_heads", None)
    if isinstance(kv, int) and 0 < kv < H and H % kv == 0:
        structure["kv_heads"] = kv
    if not _is_causal(config) or Tq != Tk:
        return structure
    i, j = np.arange(Tq)[:, None], np.arange(Tk)[None, :]
    keep = np.broadcast_to(j <= i, (L, 1, Tq, Tk)).copy()
    window = getattr(config, "sliding_window", None)
    if isinstance(window, int) and window > 0 and getattr(config, "use_sliding_window", True):
        # Per layer where the config says (Gemma 2, Qwen 2), else every layer (Mistral).
        kinds = getattr(config, "layer_types", None) or ["sliding_attention"] * L
        for layer, kind in enumerate(kinds[:L]):
            if kind == "sliding_attention":
                keep[layer, 0] &= j > i - window  # transformers: the window counts the query
    if all(np.all(w[..., ~keep[n, 0]] == 0) for n, w in enumerate(weights)):
        structure["mask"] = keep
    return structure


def _page_name(source: str) -> str:
    stem = Path(source.rstrip("/\\")).name
    stem = stem[:-4] if stem.endswith(".npz") else stem
    return (re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "attention") + ".html"


def view_file(
    source: PathLike,
    out: PathLike = "attnkit-out",
    *,
    text: str | None = None,
    model_loader: ModelLoader | None = None,
    **options: Any,
) -> Path:
    """Write the explorer page of a saved ``.npz`` file, or of a model run on ``text``.

    Args:
        source: an ``.npz`` file (see :func:`load_npz`), or a model name or folder.
        out: folder for the page, named after ``source`` (``weights.npz`` ->
            ``weights.html``).
        text: the input the model reads (models only).
        model_loader: ``loader(source, text) -> (attentions, tokens[, structure])`` for a
            model (default: ``attnkit.integrations.transformers.attentions_for_text``, with
            the causal mask and key/value heads from the model's config).
        options: passed to :func:`explore` (``precision``, ``layers``, ``max_bytes``...).

    Returns:
        The path of the page.

    Raises:
        ValueError: a source that is neither a readable ``.npz`` nor a loadable model, or a
            model without ``text``.
    """
    src = os.fspath(source)
    if src.endswith(".npz") or os.path.isfile(src):
        if not os.path.isfile(src):
            raise ValueError(f"{src}: no such file")
        if text is not None:
            raise ValueError("--text is for a model; a .npz file holds its tokens")
        try:
            ex = load_npz(src, **options)
        except (OSError, zlib.error) as err:
            raise ValueError(f"{src}: not a readable .npz file ({err})") from None
        except ValueError as err:
            raise ValueError(str(err) if src in str(err) else f"{src}: {err}") from None
    else:
        if text is None:
            raise ValueError(f"{src} is not a .npz file, so it names a model, and a model "
                             "needs --text")
        loader = model_loader or _default_model_loader()
        weights, tokens, *structure = loader(src, text)
        for name, value in (structure[0] if structure else {}).items():
            options.setdefault(name, value)  # the caller's options win
        options.setdefault("title", f"{src}: {text[:60]}")
        ex = explore(weights, tokens, **options)
    return ex.save(Path(out) / _page_name(src))


def add_view_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``attnkit view``, added to ``parser``."""
    parser.add_argument("source", metavar="MODEL_OR_PATH",
                        help="a .npz of saved weights (Explorer.save_npz, or np.savez with "
                             "'weights' and 'tokens'), or a transformers model with --text")
    parser.add_argument("--text", default=None, help="the text a model reads")
    parser.add_argument("--out", default="attnkit-out",
                        help="folder for the page (default: %(default)s)")
    parser.add_argument("--precision", choices=PRECISIONS, default="uint8",
                        help="how weights are stored in the page (default: %(default)s)")
    parser.add_argument("--layers", type=int, nargs="+", default=None, metavar="N",
                        help="show only these layers")
    parser.add_argument("--max-mb", type=float, default=DEFAULT_MAX_BYTES / 1e6,
                        help="size limit of the page in MB (default: %(default)s)")


def run_view(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """``attnkit view``: write the page and say where; a bad source is an argument error
    (one line, exit code 2, through ``parser.error``)."""
    if not args.max_mb > 0:
        parser.error(f"--max-mb must be positive, got {args.max_mb}")
    try:
        path = view_file(args.source, args.out, text=args.text, precision=args.precision,
                         layers=args.layers, max_bytes=int(args.max_mb * 1e6))
    except (ValueError, TypeError) as err:
        parser.error(str(err))
    size = path.stat().st_size
    shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{size / 1e3:.0f} kB"
    print(f"wrote {path} ({shown}): open it in a browser; no server needed")
    return 0


def view_main(argv: Sequence[str] | None = None) -> int:
    """``python -m attnkit.viz.view MODEL_OR_PATH ...``, the same as ``attnkit view``."""
    parser = argparse.ArgumentParser(
        prog="attnkit view",
        description="Write a standalone HTML attention explorer for saved weights (.npz) "
                    "or for a transformers model reading --text.",
    )
    add_view_arguments(parser)
    return run_view(parser.parse_args(argv), parser)


if __name__ == "__main__":
    sys.exit(view_main())
