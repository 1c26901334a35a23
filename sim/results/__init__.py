"""What a run measured and where it goes, in three rooms that import downwards only:
files (RunResult, the summary, result files and directories) -> record (the recorder and its
bounded aggregates) -> stats (sketches, windows, intervals, SLOs).

Nothing here draws (sim.plots) or runs a simulation (sim.experiments).
"""
