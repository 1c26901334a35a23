"""Running scenarios: one scenario (run), its result directory (outputs), variants over load
with SLO bisection (compare), grids over fields in parallel processes (sweep), and
the batch-slot picture's small simulations (slots).
"""
