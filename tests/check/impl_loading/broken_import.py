"""A file that raises while it is imported."""

raise RuntimeError("set the DATA_DIR environment variable first")
