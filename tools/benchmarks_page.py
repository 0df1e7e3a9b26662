"""Build BENCHMARKS.md (and its plots) from the recorded benchmark runs.

Every script under ``benchmarks/`` appends one JSON line per table it measures to
``benchmarks/results.jsonl`` (``benchmarks/_report.py``): the question it answers, the
title, date, machine, library versions, the exact command, the table (columns and rows as
values) and the notes. That file is the history. ``BENCHMARKS.md`` is the current state,
made from it by this script: for each question the latest figures with their date and
command, and plots where a picture reads faster (PNG under ``docs/img/benchmarks/``).

    python tools/benchmarks_page.py                 # rewrite BENCHMARKS.md and the plots
    python tools/benchmarks_page.py --check         # exit 1 if BENCHMARKS.md is stale
    python tools/benchmarks_page.py --history numpy-vs-sdpa   # every run of one question
    python tools/benchmarks_page.py --import-markdown OLD.md  # records from an old log

``--import-markdown`` reads a log in the format the scripts used to append to
BENCHMARKS.md (``## title``, ``- date:``/``- machine:``/``- versions:``/``- command:``
lines, a Markdown table, notes) and appends the runs not recorded yet.
"""

from __future__ import annotations

import argparse
import json
import math
import numbers
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORDS = ROOT / "benchmarks" / "results.jsonl"
PAGE = ROOT / "BENCHMARKS.md"
IMAGES = ROOT / "docs" / "img" / "benchmarks"
COMMAND = "python tools/benchmarks_page.py"

# The keys of a record, in the order they are written; all are required.
FIELDS = ("question", "title", "date", "machine", "versions", "command", "columns", "rows",
          "notes")

# -- questions --------------------------------------------------------------------------


@dataclass(frozen=True)
class Question:
    """One question the page answers, and how its latest table is shown.

    Attributes:
        id: the ``question`` of its records.
        heading: the page's heading for it.
        titles: the record titles it covers, without their trailing ``(...)``.
        about: one or two sentences: what is compared, and which way is better.
        columns: the columns the page shows (None = all), the record keeps every one.
        key: how many leading columns name a row: a row of an older run is still shown
            while no newer run of the same table has its name.
        table: False: the page gives the latest run's date and command, not its table.
        on_page: False: a one-off kept in the records only, named at the page's end.
        retired: row names the benchmark no longer produces (renamed or split): kept in
            the history, never shown as a current figure.
    """

    id: str
    heading: str
    titles: tuple[str, ...]
    about: str
    columns: tuple[str, ...] | None = None
    key: int = 1
    table: bool = True
    on_page: bool = True
    retired: tuple[str, ...] = ()


QUESTIONS: tuple[Question, ...] = (
    Question(
        "torch-vs-sdpa", "attnkit.torch vs the PyTorch call it wraps",
        ("attnkit.torch vs the PyTorch call it wraps: prefill, decoding, need_weights",),
        "`attnkit.torch.attention` and a `MultiHeadAttention` KV-cache step against SDPA "
        "with the same mask (eager softmax where weights are returned), forward only, one "
        "thread. ratio = attnkit / peer time.",
        # Split on 2026-11-26 into "(kept by the cache)" and "(valid_lens)".
        retired=("MHA decode step Tk=160 E=512 H=8 B=4, padding",
                 "MHA decode step Tk=4096 E=512 H=8 B=4, padding"),
    ),
    Question(
        "transformers-vs-sdpa", "transformers integration vs `sdpa` / `eager`",
        ("attnkit as a transformers attn_implementation vs sdpa / eager",),
        "A small Llama (4 layers, width 256) with `attn_implementation=\"attnkit\"` against "
        "the same model on `sdpa` (`eager` for attention weights), one "
        "thread. ratio = attnkit / peer CPU time.",
        columns=("case", "peer", "peer CPU ms", "attnkit CPU ms", "ratio", "wall ratio"),
    ),
    Question(
        "mha-vs-nn-mha", "MultiHeadAttention vs nn.MultiheadAttention, need_weights=False",
        ("attnkit.torch MultiHeadAttention vs nn.MultiheadAttention, forward+backward, "
         "need_weights=False",),
        "Forward + backward with the same weights and inputs; ratio = attnkit / nn.MHA.",
        columns=("config", "nn.MHA ms", "attnkit ms", "ratio", "nn.MHA peak MiB",
                 "attnkit peak MiB"),
    ),
    Question(
        "mha-vs-nn-mha-weights", "MultiHeadAttention vs nn.MultiheadAttention, need_weights=True",
        ("attnkit.torch MultiHeadAttention vs nn.MultiheadAttention, forward+backward, "
         "need_weights=True",),
        "Both return head-averaged weights; attnkit keeps its fused kernel for the output.",
        columns=("config", "nn.MHA ms", "attnkit ms", "ratio", "nn.MHA peak MiB",
                 "attnkit peak MiB"),
    ),
    Question(
        "mha-swap", "`swap_attention` in nn.TransformerEncoder (training)",
        ("nn.TransformerEncoder, nn.MultiheadAttention vs attnkit swap_attention, "
         "forward+backward, training mode",),
        "A 6-layer encoder whose `nn.MultiheadAttention` modules are swapped for attnkit's; "
        "ratio = swapped / torch.",
        columns=("case", "torch ms", "swapped ms", "ratio", "torch peak MiB",
                 "swapped peak MiB"),
    ),
    Question(
        "kv-cache", "KV-cache decoding vs recomputing the prefix",
        ("attnkit.torch KV-cache decoding vs full recompute per step",),
        "`MultiHeadAttention` decoding with a `KVCache` against a full causal forward over "
        "the prefix at every step; speed-up = recompute / cache.",
        columns=("case", "recompute ms", "KV cache ms", "speed-up"),
    ),
    Question(
        "need-weights-memory", "need_weights=True: peak memory vs eager",
        ("attnkit.torch need_weights=True vs eager softmax(q k^T) v: peak memory",),
        "Peak memory of returning the weights: ratio = attnkit / eager.",
        columns=("case", "eager peak MiB", "attnkit peak MiB", "ratio",
                 "one (B,H,T,T) f32 MiB"),
    ),
    Question(
        "packed", "Packed documents: segment_ids vs SDPA with a dense mask",
        ("Packed documents, attnkit segment_ids vs SDPA with a dense mask",),
        "8 documents packed in one sequence; speed-up = SDPA+mask / attnkit.",
    ),
    Question(
        "additive", "AdditiveAttention: key-chunked vs materialised",
        ("attnkit.torch AdditiveAttention: key-chunked vs materialised (B, Tq, Tk, h)",),
        "Bahdanau attention computed a chunk of keys at a time against one "
        "(B, Tq, Tk, h) feature tensor; ratio = chunked / materialised time.",
        columns=("case", "materialised ms", "chunked ms", "ratio", "materialised peak MiB",
                 "chunked peak MiB"),
    ),
    Question(
        "numpy-vs-sdpa", "NumPy attention vs torch SDPA",
        ("NumPy attention on the CPU vs torch SDPA",),
        "The NumPy oracle (`numpy SDPA`) and its tiled flash loop against torch SDPA on the "
        "same inputs, float32; vs torch = NumPy / torch time, paired per round.",
        columns=("T", "op", "time (ms)", "torch (ms)", "vs torch", "peak RSS (MiB)",
                 "torch peak RSS (MiB)"),
        key=2,
    ),
    Question(
        "numpy-tiles", "NumPy flash tile sizes",
        ("NumPy flash_attention tile sizes vs torch SDPA",),
        "Tile shapes of the NumPy flash loop; vs torch as above.",
    ),
    Question(
        "precision-sdpa", "Precision: backend='sdpa' vs the math path",
        ("attnkit.torch backend='sdpa' on CPU, float32: error / math path's error",),
        "float32 error against float64, as a multiple of the math path's error.",
    ),
    Question(
        "precision-blockwise", "Precision: blockwise attention at large logits",
        ("Blockwise attention in float32 at large logits: max error",),
        "Max float32 error against float64 (and as a multiple of plain float32 math).",
        columns=("inputs", "backend", "out", "dq", "dk", "dv"),
    ),
    Question(
        "ring-work", "Ring attention: causal work per rank",
        ("Ring attention: causal work per rank, zigzag vs contiguous",),
        "Counted from the block schedule, not timed.",
        columns=("P", "layout", "max TFLOP/rank", "busiest/even", "critical path/even"),
        key=2,
    ),
    Question(
        "ring-bytes", "Ring attention: bytes per step and H100 estimate",
        ("Ring attention: bytes sent per rank per step, and per-step time at H100 rates",),
        "Bytes counted; times estimated from published H100/NVLink/PCIe rates, not "
        "measured.",
        columns=("T", "P", "fwd MiB/step", "fwd compute us", "NVLink us", "PCIe us",
                 "hidden NVLink", "hidden PCIe"),
        key=2,
    ),
    Question(
        "ring-gloo", "Ring attention on CPU: 2 processes vs one",
        ("Ring attention on CPU with gloo: 2 processes vs one process",),
        "Two gloo processes with a thread each against one process.",
    ),
    Question(
        "triton-visits", "Triton packed documents: key blocks visited",
        ("attnkit.triton packed documents: key blocks the forward kernel visits",),
        "Counted by the kernel (interpreter build), not timed.",
        columns=("docs", "doc len", "mask", "all blocks", "dense visits", "segment visits",
                 "vs dense", "1/docs"),
        key=3,
    ),
    Question(
        "triton-gpu", "Triton kernels on a GPU",
        ("attnkit.triton on H100: not measured",),
        "Speed on a GPU: `benchmarks/triton_gpu.py` (dense vs SDPA flash/cuDNN, fused "
        "features, decode bandwidth) has not been run on one yet.",
        table=False,
    ),
    Question(
        "numpy-loop-split", "NumPy flash: before and after the loop/tiles split",
        ("numpy flash before and after the split of its loop from tiles and threads",),
        "A one-off comparison of two commits (issue 24).",
        on_page=False,
    ),
)
BY_ID = {q.id: q for q in QUESTIONS}


def _base_title(title: str) -> str:
    """The title without a trailing parenthesis (the sizes and machine it ran at)."""
    return re.sub(r"\s*\((?:[^()]|\([^()]*\))*\)\s*$", "", title.strip())


def question_of(title: str) -> str:
    """The question a table with this title answers: a known question's id, else the title
    as a slug (its own section on the page, until it is named in :data:`QUESTIONS`)."""
    base = _base_title(title)
    for q in QUESTIONS:
        if any(base == _base_title(t) or title.startswith(t) for t in q.titles):
            return q.id
    return re.sub(r"[^a-z0-9]+", "-", base.lower()).strip("-")[:60] or "untitled"


# -- records ----------------------------------------------------------------------------


def cell_value(text: str) -> object:
    """A Markdown cell as a value: int or float where it reads as one, else the text."""
    text = text.strip()
    if re.fullmatch(r"[-+]?\d+", text):
        return int(text)
    if re.fullmatch(r"[-+]?(\d+\.\d*|\.\d+|\d+)([eE][-+]?\d+)?", text):
        return float(text)
    return text


def json_value(x: object) -> object:
    """A table cell as JSON: numbers, and text that reads as one, are numbers (NaN/inf
    become the strings "nan", "inf", "-inf"); other text stays text, anything else is its
    ``str``."""
    if isinstance(x, str):
        return cell_value(x)  # "0.083" is a number; "2.40x" stays text
    if isinstance(x, bool):
        return str(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, numbers.Real):
        f = float(x)
        if math.isfinite(f):
            return f
        return "nan" if math.isnan(f) else ("inf" if f > 0 else "-inf")
    return str(x)


def make_record(question: str, title: str, date: str, machine: str, versions: str,
                command: str, columns: Sequence[str], rows: Iterable[Sequence[object]],
                notes: str = "") -> dict:
    """One run as a record (the keys of :data:`FIELDS`, in that order)."""
    return {
        "question": question, "title": title, "date": date, "machine": machine,
        "versions": versions, "command": command, "columns": [str(c) for c in columns],
        "rows": [[json_value(c) for c in row] for row in rows], "notes": notes,
    }


def check_record(rec: object, where: str = "record") -> dict:
    """``rec`` if it is a well-formed record, else ValueError naming what is wrong."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    for f in ("question", "title", "date", "machine", "versions", "command"):
        if not isinstance(rec[f], str) or not rec[f].strip():
            raise ValueError(f"{where}: {f} must be a non-empty string, got {rec[f]!r}")
    if not re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", rec["date"]):
        raise ValueError(f"{where}: date must read YYYY-MM-DD HH:MM UTC, got {rec['date']!r}")
    cols, rows = rec["columns"], rec["rows"]
    if not isinstance(cols, list) or not cols or not all(isinstance(c, str) for c in cols):
        raise ValueError(f"{where}: columns must be a non-empty list of strings")
    if not isinstance(rows, list) or any(
            not isinstance(r, list) or len(r) != len(cols) for r in rows):
        raise ValueError(f"{where}: every row must be a list of {len(cols)} cells")
    if not isinstance(rec["notes"], str):
        raise ValueError(f"{where}: notes must be a string")
    return rec


def load_records(path: Path | None = None) -> list[dict]:
    """Every record of ``path`` (default :data:`RECORDS`; one JSON object per line),
    checked, in file order."""
    path = path or RECORDS
    records = []
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path.name}:{n}: not JSON: {err}") from None
            records.append(check_record(rec, f"{path.name}:{n}"))
    return records


def append_record(rec: dict, path: Path | None = None) -> None:
    """Append one checked record as a JSON line to ``path`` (default :data:`RECORDS`)."""
    check_record(rec)
    with (path or RECORDS).open("a") as f:
        f.write(json.dumps(rec, ensure_ascii=False) + "\n")


# -- reading the old Markdown log -------------------------------------------------------


def _table(lines: list[str]) -> tuple[list[str], list[list[object]]]:
    def cells(line: str) -> list[str]:
        # split on pipes, but not on a pipe inside a cell like "max |err|"
        parts = re.split(r"(?<!\S)\|(?!\S)|^\||\|$", line.strip())
        return [p.strip() for p in parts[1:-1]]

    header = cells(lines[0])
    rows = [[cell_value(c) for c in cells(line)] for line in lines[2:]]
    return header, rows


def parse_markdown_log(text: str) -> list[dict]:
    """The runs of a Markdown log as records (see the module docstring for the format).

    A field line ``- key: value`` may continue on indented lines. A command with a remark
    after its backticks keeps the remark in the notes; a section with no ``command`` field
    takes the first backticked ``python ...`` in its text; a date range keeps its end (the
    range goes to the notes). Text before the table joins the notes, before the text after.
    """
    records = []
    for section in re.split(r"^## ", text, flags=re.M)[1:]:
        lines = section.rstrip("\n").split("\n")
        title, body = lines[0].strip(), lines[1:]
        fields: dict[str, str] = {}
        i, last = 0, None
        while i < len(body) and not body[i].strip():
            i += 1
        while i < len(body) and (body[i].startswith("- ") or (last and body[i].startswith("  "))):
            m = re.match(r"- ([\w ]+): (.*)", body[i])
            if m:
                last = m.group(1)
                fields[last] = m.group(2).strip()
            else:
                fields[last] += " " + body[i].strip()
            i += 1
        rest = body[i:]
        start = next(n for n, line in enumerate(rest) if line.startswith("|"))
        end = start
        while end < len(rest) and rest[end].startswith("|"):
            end += 1
        columns, rows = _table(rest[start:end])
        before = "\n".join(rest[:start]).strip()
        after = "\n".join(rest[end:]).strip()
        extra = []
        m = re.fullmatch(r"`([^`]+)`\s*(.*)", fields.get("command", ""))
        if m:
            command = m.group(1)
            if m.group(2):
                extra.append(f"command: {m.group(2)}")
        else:
            command = re.search(r"`(python [^`]+)`", before).group(1)
        date = fields["date"]
        rng = re.fullmatch(r"(\S+ \S+) - (\S+ \S+) UTC", date)
        if rng:
            extra.append(f"ran {date}")
            date = rng.group(2) + " UTC"
        for key, value in fields.items():
            if key not in ("date", "machine", "versions", "command"):
                extra.append(f"{key}: {value}")
        notes = "\n\n".join(p for p in ("\n".join(extra), before, after) if p)
        records.append(make_record(question_of(title), title, date, fields["machine"],
                                   fields["versions"], command, columns, rows, notes))
    return records


def import_markdown(path: Path, records_path: Path | None = None) -> int:
    """Append the runs of the Markdown log ``path`` that ``records_path`` lacks (same
    title, date and command); returns how many."""
    records_path = records_path or RECORDS
    have = ({(r["title"], r["date"], r["command"]) for r in load_records(records_path)}
            if records_path.exists() else set())
    new = [r for r in parse_markdown_log(path.read_text())
           if (r["title"], r["date"], r["command"]) not in have]
    for rec in new:
        append_record(rec, records_path)
    return len(new)


# -- the page ---------------------------------------------------------------------------


def latest_first(records: Sequence[dict]) -> list[dict]:
    """``records`` newest first: by date, and among equal dates the later in the file."""
    order = sorted(range(len(records)), key=lambda i: (records[i]["date"], i), reverse=True)
    return [records[i] for i in order]


def current_rows(runs: Sequence[dict], key: int, retired: Sequence[str] = ()
                 ) -> list[tuple[dict, list[list]]]:
    """The current figures of one table: the newest run's rows, then, from older runs
    with the same columns, the rows whose name (first ``key`` cells) no newer run has
    and that are not ``retired``.

    Args:
        runs: the runs of one question, newest first.
        key: how many leading cells name a row.
        retired: names (of one-cell keys) that no current run produces any more.

    Returns:
        ``[(run, its rows shown)]``, newest first, runs with no row left out.
    """
    shown, seen = [], {(name,) for name in retired}
    for run in runs:
        if run["columns"] != runs[0]["columns"]:
            continue
        rows = [r for r in run["rows"] if tuple(r[:key]) not in seen]
        seen.update(tuple(r[:key]) for r in run["rows"])
        if rows:
            shown.append((run, rows))
    return shown


RATIO_COLUMN = re.compile(r"ratio|speed-?up|^vs torch$|/even")


def format_cell(x: object, column: str) -> str:
    """A value as the page shows it: ratios with 2 decimals, other numbers with 3
    significant digits (no exponent from 100 up), text as it is (``|`` escaped)."""
    if isinstance(x, str):
        return x.replace("|", "\\|")
    if RATIO_COLUMN.search(column) and 0.01 <= abs(x) < 10:
        return f"{x:.2f}"
    if isinstance(x, int):
        return str(x)
    if x == 0:
        return "0"
    return f"{x:.0f}" if abs(x) >= 100 else f"{x:.3g}"


def markdown_table(columns: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    head = "| " + " | ".join(c.replace("|", "\\|") for c in columns) + " |"
    rule = "|" + "|".join("---" if i else ":--" for i in range(len(columns))) + "|"
    body = ["| " + " | ".join(format_cell(c, col) for c, col in zip(row, columns)) + " |"
            for row in rows]
    return "\n".join([head, rule, *body])


def _context(run: dict, common: dict[str, str]) -> str:
    """``date, `command``` plus machine/versions where they differ from the page's."""
    parts = [run["date"], f"`{run['command']}`"]
    parts += [f"{f}: {run[f]}" for f in ("machine", "versions") if run[f] != common[f]]
    return ", ".join(parts)


def _most_common(values: Iterable[str]) -> str:
    values = list(values)
    return max(sorted(set(values)), key=values.count) if values else ""


def _question_block(q: Question, runs: list[dict], common: dict[str, str]) -> list[str]:
    groups = current_rows(runs, q.key, q.retired)
    latest = runs[0]
    columns = [c for c in (q.columns or latest["columns"]) if c in latest["columns"]]
    pick = [latest["columns"].index(c) for c in columns]
    earlier = len(runs) - 1
    lines = [f"## {q.heading}", "", q.about, ""]
    if not q.table:
        lines += [f"Latest record: {_context(latest, common)}; its table and notes: "
                  f"`--history {q.id}`.", ""]
        return lines
    if len(groups) == 1:
        lines.append(f"Latest run: {_context(latest, common)}.")
        rows = [[r[i] for i in pick] for r in groups[0][1]]
        table = markdown_table(columns, rows)
    else:
        lines.append("Latest figure of each row, from these runs:")
        lines.append("")
        for n, (run, _) in enumerate(groups, 1):
            lines.append(f"{n}. {_context(run, common)}")
        rows = [[n] + [r[i] for i in pick] for n, (_, rs) in enumerate(groups, 1) for r in rs]
        table = markdown_table(["run", *columns], rows)
    lines += ["", table, ""]
    hidden = [c for c in latest["columns"] if c not in columns]
    more = f"{earlier} earlier run{'s' * (earlier != 1)}" if earlier else "no earlier run"
    lines.append(f"<sub>{more}; every column and the notes: `--history {q.id}`"
                 + (f" (not shown: {', '.join(hidden)})" if hidden else "") + "</sub>")
    lines.append("")
    return lines


def build_page(records: Sequence[dict], plots: Sequence[str] = ()) -> str:
    """BENCHMARKS.md made from ``records``: a header, the plots (file names under
    ``docs/img/benchmarks/``), and for each question its current figures."""
    by_q: dict[str, list[dict]] = {}
    for rec in records:
        by_q.setdefault(rec["question"], []).append(rec)
    order = [q.id for q in QUESTIONS if q.id in by_q] + sorted(set(by_q) - set(BY_ID))
    runs = {qid: latest_first(by_q[qid]) for qid in order}
    common = {f: _most_common(runs[qid][0][f] for qid in order) for f in ("machine", "versions")}
    lines = [
        "# Benchmarks",
        "",
        f"The current figures, built by `{COMMAND}` from the history in",
        "[benchmarks/results.jsonl](benchmarks/results.jsonl) (one JSON line per measured",
        "table: date, machine, versions, exact command); do not edit this page by hand.",
        "Each script under `benchmarks/` records its tables and rebuilds this page (`--quick`",
        "and `--smoke` record nothing). Ratios are measured side by side in one run, attnkit",
        "against its peer on the same inputs; a time ratio attnkit / peer below 1 means",
        "attnkit is faster; a paired ratio is the median of per-round ratios, not the ratio",
        "of the medians beside it. Older runs, every column and the notes of a question:",
        f"`{COMMAND} --history QUESTION` (the name under each table).",
        "",
        f"Unless a run says otherwise: {common['machine']} (a shared VM: absolute times are",
        f"noisy, read the paired ratios); {common['versions']}.",
        "",
    ]
    for name in plots:
        alt = PLOT_ALT.get(name, name)
        lines += [f"![{alt}](docs/img/benchmarks/{name})", ""]
    off_page = []
    for qid in order:
        q = BY_ID.get(qid) or Question(qid, runs[qid][0]["title"], (), "")
        if q.on_page:
            lines += _question_block(q, runs[qid], common)
        else:
            off_page.append(f"{q.heading} (`--history {qid}`)")
    if off_page:
        lines += ["## In the records only", "", "; ".join(off_page) + ".", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def history(records: Sequence[dict], qid: str) -> str:
    """Every run of one question, newest first, each with its full table and notes."""
    runs = latest_first([r for r in records if r["question"] == qid])
    if not runs:
        known = ", ".join(sorted({r["question"] for r in records}))
        raise ValueError(f"no runs of question {qid!r}; recorded questions: {known}")
    out = []
    for run in runs:
        out += [f"## {run['title']}", "", f"- date: {run['date']}",
                f"- machine: {run['machine']}", f"- versions: {run['versions']}",
                f"- command: `{run['command']}`", "",
                markdown_table(run["columns"], run["rows"]), ""]
        if run["notes"]:
            out += [run["notes"], ""]
    return "\n".join(out)


# -- plots ------------------------------------------------------------------------------

PLOT_ALT = {
    "ratios.png": "attnkit / peer time, one bar per timed row below",
    "by_size.png": "decoding step / SDPA by cache length; NumPy / torch SDPA by length",
}

# (question, label of a row, attnkit / peer time of a row, or None to leave the row out)
_BARS = (
    ("torch-vs-sdpa", lambda c, r: r[c.index("case")], lambda c, r: r[c.index("ratio")]),
    ("transformers-vs-sdpa", lambda c, r: f"{r[c.index('case')]} vs {r[c.index('peer')]}",
     lambda c, r: None if str(r[0]).startswith("(") else r[c.index("ratio")]),
    ("mha-vs-nn-mha", lambda c, r: f"{r[0]}, fwd+bwd", lambda c, r: r[c.index("ratio")]),
    ("mha-vs-nn-mha-weights", lambda c, r: f"{r[0]}, fwd+bwd, need_weights",
     lambda c, r: r[c.index("ratio")]),
    ("mha-swap", lambda c, r: f"encoder, {r[0]}", lambda c, r: r[c.index("ratio")]),
    ("packed", lambda c, r: f"packed, {r[0]}", lambda c, r: 1 / r[c.index("speed-up")]),
    ("numpy-vs-sdpa", lambda c, r: f"NumPy flash, T={r[0]}",
     lambda c, r: r[c.index("vs torch")] if r[1] == "numpy flash" else None),
)
_DECODE = re.compile(r"^(MHA decode step|decode) .*Tk=(\d+).*, (causal|padding)$")


def _current(records: Sequence[dict], qid: str) -> list[tuple[dict, list[list]]]:
    runs = latest_first([r for r in records if r["question"] == qid])
    return current_rows(runs, BY_ID[qid].key, BY_ID[qid].retired) if runs else []


def draw_plots(records: Sequence[dict], folder: Path) -> list[str]:
    """Draw the page's plots into ``folder``; returns their file names (none without
    matplotlib, or without the records a plot needs)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    folder.mkdir(parents=True, exist_ok=True)
    made = []
    plt.rcParams.update({"font.size": 8, "svg.hashsalt": "attnkit"})
    meta = {"Software": None}  # no matplotlib version in the file: same records, same bytes

    bars = []  # (question, label, ratio)
    for qid, label, ratio in _BARS:
        for run, rows in _current(records, qid):
            for row in rows:
                value = ratio(run["columns"], row)
                if isinstance(value, (int, float)):
                    bars.append((qid, label(run["columns"], row), float(value), row[0]))
        if qid == "numpy-vs-sdpa":  # by T, not by the run each row comes from
            bars[:] = [b for b in bars if b[0] != qid] + sorted(
                (b for b in bars if b[0] == qid), key=lambda b: b[3])
    if bars:
        colors = plt.get_cmap("tab10")
        qids = list(dict.fromkeys(b[0] for b in bars))
        legend_rows = (len(qids) + 1) // 2
        height = 1.3 + 0.19 * len(bars) + 0.22 * legend_rows
        fig, ax = plt.subplots(figsize=(10, height))
        y = list(range(len(bars)))[::-1]
        ax.barh(y, [b[2] for b in bars], left=0, height=0.7,
                color=[colors(qids.index(b[0]) % 10) for b in bars])
        ax.set_yticks(y, [b[1] for b in bars])
        ax.set_xscale("log")
        ax.axvline(1.0, color="black", lw=0.8)
        ax.set_xlabel("attnkit / peer time (log scale; < 1: attnkit faster)")
        for yi, b in zip(y, bars):
            ax.text(b[2], yi, f" {b[2]:.2f}", va="center", fontsize=9)
        ax.set_xlim(min(0.3, min(b[2] for b in bars) / 1.5), max(b[2] for b in bars) * 2)
        ax.set_ylim(-0.6, len(bars) - 0.4)
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors(i % 10)) for i in range(len(qids))]
        fig.legend(handles, [BY_ID[q].heading.replace("`", "") for q in qids], ncol=2,
                   loc="lower center", fontsize=8.5, frameon=False)
        ax.set_title("attnkit / peer time, latest figure of each row")
        fig.tight_layout(rect=(0, (0.25 + 0.22 * legend_rows) / height, 1, 1))
        fig.savefig(folder / "ratios.png", dpi=90, metadata=meta)
        plt.close(fig)
        made.append("ratios.png")

    decode = _decode_points(records)
    numpy_points = _numpy_points(records)
    if decode or numpy_points:
        fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.2))
        for name, (xs, ys, old) in sorted(decode.items()):
            if old:
                left.scatter(*zip(*old), s=6, color="0.75", zorder=1)
            left.plot(xs, ys, marker="o", label=name, zorder=2)
        left.axhline(1.0, color="black", lw=0.8)
        left.axhline(1.05, color="tab:red", lw=0.8, ls="--", label="target 1.05")
        top = max(1.3, 1.1 * max(y for _, ys, _ in decode.values() for y in ys))
        left.set_ylim(0.9, top)  # earlier runs far above (up to 5x) are cut off
        left.set_xscale("log")
        ticks = sorted({x for xs, _, _ in decode.values() for x in xs})
        left.set_xticks(ticks, [str(t) for t in ticks])
        left.minorticks_off()
        left.set_xlabel("cache length Tk")
        left.set_ylabel("attnkit / SDPA time")
        left.set_title("Decoding step vs SDPA (grey: earlier runs)")
        left.legend(fontsize=8.5, loc="upper right")
        for name, points in sorted(numpy_points.items()):
            xs, ys = zip(*sorted(points.items()))
            right.plot(xs, ys, marker="o", label=name)
        right.axhline(1.0, color="black", lw=0.8)
        right.set_xscale("log", base=2)
        right.set_yscale("log")
        sizes = sorted({t for points in numpy_points.values() for t in points})
        right.set_xticks(sizes, [str(t) for t in sizes])
        right.minorticks_off()
        top = max(v for points in numpy_points.values() for v in points.values())
        ticks = [t for t in (1, 1.25, 1.5, 2, 3, 5, 8, 13, 20, 30) if t <= top * 1.3]
        right.set_yticks(ticks, [f"{t:g}" for t in ticks])
        right.set_xlabel("sequence length T")
        right.set_ylabel("NumPy / torch SDPA time")
        right.set_title("NumPy attention vs torch SDPA (float32)")
        right.legend(fontsize=8.5)
        fig.tight_layout()
        fig.savefig(folder / "by_size.png", dpi=90, metadata=meta)
        plt.close(fig)
        made.append("by_size.png")
    return made


def _decode_points(records: Sequence[dict]) -> dict[str, tuple[list, list, list]]:
    """Per decoding case (``attention() decode, causal``, ``MHA step, padding``, ...): the
    latest run's ``(Tk values, ratios)`` and the earlier runs' ``(Tk, ratio)`` points."""
    runs = latest_first([r for r in records if r["question"] == "torch-vs-sdpa"])
    out: dict[str, tuple[list, list, list]] = {}
    for n, run in enumerate(runs):
        c = run["columns"]
        for row in run["rows"]:
            m = _DECODE.match(str(row[c.index("case")]))
            if not m or not isinstance(row[c.index("ratio")], (int, float)):
                continue
            kind = "MHA KV step" if m.group(1).startswith("MHA") else "attention() decode"
            xs, ys, old = out.setdefault(f"{kind}, {m.group(3)}", ([], [], []))
            point = (int(m.group(2)), float(row[c.index("ratio")]))
            if n == 0:
                xs.append(point[0])
                ys.append(point[1])
            else:
                old.append(point)
    return {k: v for k, v in out.items() if v[0]}


def _numpy_points(records: Sequence[dict]) -> dict[str, dict[int, float]]:
    """Per NumPy op and thread setting, the latest ``vs torch`` ratio at each T."""
    out: dict[str, dict[int, float]] = {}
    for run in latest_first([r for r in records if r["question"] == "numpy-vs-sdpa"]):
        c = run["columns"]
        threads = "1 thread" if "--threads 1" in run["command"] else "2 threads"
        for row in run["rows"]:
            points = out.setdefault(f"{row[c.index('op')]}, {threads}", {})
            points.setdefault(int(row[c.index("T")]), float(row[c.index("vs torch")]))
    return out


# -- command line -----------------------------------------------------------------------


def write_page(records_path: Path | None = None, page: Path | None = None,
               images: Path | None = None, plots: bool = True) -> str:
    """Rebuild ``page`` (and, with ``plots``, its PNGs in ``images``) from
    ``records_path`` (defaults: :data:`RECORDS`, :data:`PAGE`, :data:`IMAGES`); returns
    the page. Without matplotlib the plots already there are kept and linked."""
    page, images = page or PAGE, images or IMAGES
    records = load_records(records_path)
    names = draw_plots(records, images) if plots else []
    if not names:
        names = page_plots(images)
    text = build_page(records, names)
    page.write_text(text)
    return text


def page_plots(images: Path | None = None) -> list[str]:
    """The plot files the page links: those of :data:`PLOT_ALT` that exist in ``images``
    (default :data:`IMAGES`)."""
    return [n for n in PLOT_ALT if ((images or IMAGES) / n).exists()]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if BENCHMARKS.md is not what the records give")
    parser.add_argument("--history", metavar="QUESTION",
                        help="print every run of one question, newest first")
    parser.add_argument("--import-markdown", metavar="FILE", type=Path,
                        help="append the runs of an old Markdown log that are not recorded")
    parser.add_argument("--no-plots", action="store_true", help="leave the PNGs as they are")
    args = parser.parse_args(argv)
    if args.history:
        try:
            print(history(load_records(), args.history))
        except ValueError as err:
            print(err, file=sys.stderr)
            return 2
        return 0
    if args.check:
        want = build_page(load_records(), page_plots())
        if not PAGE.exists() or PAGE.read_text() != want:
            print(f"BENCHMARKS.md is stale: run `{COMMAND}`", file=sys.stderr)
            return 1
        return 0
    if args.import_markdown:
        print(f"{import_markdown(args.import_markdown)} runs appended to {RECORDS.name}")
    write_page(plots=not args.no_plots)
    print(f"wrote {PAGE.name} ({PAGE.stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
