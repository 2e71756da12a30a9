"""``python -m suite reproduce RESULT.json|DIR ...``: rerun the exact recorded points here and say
whether the published number came out again.

The inputs are result files (from any machine) or folders of them. They are grouped by point: the
same fingerprint (scenario, size, resolved config with its data identity) recorded on the same
machine by the same backend. Each point's ``ok`` runs are the original sample. The rerun runs the point's recorded spec
as it stands in the file (config, data identity, ``--set`` overrides, timeout; never re-derived from
today's scenario files) as many times as there were original runs, through ``runner.run_plan`` like
``suite run`` (the same backends, peak calibration and result files, interleaved across points).

Before anything runs, what each result recorded of its making (``provenance``: the suite's revision
and whether its tree had changes, the environment's lock, the image recipe) and its data are set
against this machine now. An exact reproduction needs them equal; where they differ the command
refuses with one line per difference and what to do (``--anyway`` runs regardless and shows them
above the verdict).

The comparison is on the fit time, the figure the reports' speedups and ``compare`` divide: the
ratio rerun/original of geometric means with Welch intervals on log times (``stats.ratio``). Every
line says it as the reports do (``stats.Ratio.text``), of the rerun against the original: "the
rerun is 1.10x slower than the original (95% CI 1.05-1.16)", a factor of 1 or more whose word
says which way. The verdict (``decision``) is taken on rerun/original itself:

- ``reproduced within X%``: the 90% interval lies within +-tolerance of 1: two one-sided tests at
  5% each, the conventional test of equivalence (X is that interval's largest distance from 1,
  rounded up);
- ``differs``: the whole 95% interval lies outside +-tolerance (it excludes 1 by more than the
  tolerance);
- ``inconclusive``: neither; the output estimates, from the observed spreads, how many reruns would
  settle it, or says that the original's own runs are too few or too spread for that;
- ``not reproduced``: a rerun did not end ``ok`` (or was skipped here), or ended ok below the
  accuracy gate every original run reached.
"""

from suite.reproduce import command, comparison, equivalence, here, originals

__all__ = ["command", "comparison", "equivalence", "here", "originals"]
