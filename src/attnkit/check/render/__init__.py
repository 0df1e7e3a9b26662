"""One renderer per output: :mod:`.text` (a terminal) and :mod:`.json` (``--json``), both
in any language of :mod:`attnkit.check.catalogue`, for every kind of report (a function's,
a module's or a block's :class:`~attnkit.check.core.report.Report`, a model's
:class:`~attnkit.check.model.report.ModelReport`). They import only the catalogue and read
the reports by their attributes."""
