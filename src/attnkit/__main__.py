"""``python -m attnkit``: the same command as ``attnkit`` (see :mod:`attnkit.cli`)."""

from __future__ import annotations

from attnkit.cli import main

raise SystemExit(main())
