"""The words of the checker: every finding code and the texts of a report per language."""
