"""Scenario -> plan: scenario files and their settings, safe names, the -k language, the matrix expanded into runs."""
