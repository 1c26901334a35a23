"""Statistics with no knowledge of a run: quantile sketches, percentiles, exact moments,
steady-state windows, trend tests, Student t intervals, SLO bounds."""
