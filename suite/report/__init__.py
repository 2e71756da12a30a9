"""Results -> reports: points, figures, verdicts, statistics, Markdown pages, plots, compare and show."""
