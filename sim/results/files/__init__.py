"""A run's results as values and files: RunResult, the summary assembled in one place (with its
steady-state window and intervals), the files written, their provenance, the result directory."""
