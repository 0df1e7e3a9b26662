"""A one-line progress bar for long loops (``attnkit train`` shows one).

Standard library only: ``Progress(total).update(step, loss)`` after each step, ``close()``
at the end.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


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
