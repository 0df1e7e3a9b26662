"""attnkit.progress: the one-line progress bar of `attnkit train`."""

from __future__ import annotations

import io

from attnkit.progress import Progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_plain_lines_when_not_a_tty():
    stream = io.StringIO()
    bar = Progress(200, stream=stream, lines=4)
    for step in range(1, 201):
        bar.update(step, 1.0 / step)
    bar.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert len(lines) == 4
    assert lines[-1].startswith("step 200/200 [") and "loss 0.0050" in lines[-1]
    assert "steps/s" in lines[-1] and "eta" in lines[-1]


def test_progress_redraws_one_line_on_a_tty():
    stream = _Tty()
    bar = Progress(5, stream=stream)
    for step in range(1, 6):
        bar.update(step, 0.5)
    bar.close()
    text = stream.getvalue()
    assert text.startswith("\rstep 1/5") and text.endswith("\n")
    assert text.count("\n") == 1  # one line, redrawn in place
    assert "step 5/5 [" + "#" * 24 + "]" in text
