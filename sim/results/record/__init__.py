"""The recorder: every executed step and finished request folded into bounded aggregates (the
hot loop), and what it reports. It uses the statistics (sim.results.stats), never the files."""
