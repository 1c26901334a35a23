"""Every picture servesim draws, and nothing else: plain matplotlib `Figure`s on the Agg
canvas, drawn from frames and records that a run already produced.

Plots never run a simulation (an import-linter contract): the slot picture's
simulations live in sim.experiments.slots.
"""
