"""Running a plan: the loop over its runs, resume, the terminal's progress, the same plan on several hosts."""
