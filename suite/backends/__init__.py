"""Backends: where a RunSpec becomes a RunResult (``local`` subprocess or ``docker`` container)."""
