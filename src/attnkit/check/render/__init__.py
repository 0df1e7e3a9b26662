"""One renderer per output: :mod:`.text` (a terminal) and :mod:`.json` (``--json``), both
in any language of :mod:`attnkit.check.catalogue`."""
