"""What a run measured and where it goes: the recorder (vLLM's metrics and formulas), the
bounded statistics behind it, SLOs, the run summary built in one place, the result
files, their provenance and the result directory they are swapped into.

Nothing here draws (sim.plots) or runs a simulation (sim.experiments).
"""
