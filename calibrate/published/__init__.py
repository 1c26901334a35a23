"""Third-party measurements (calibration/measured/, fetched, never committed): the published
linear-op stacks and kernel timings read, the roofline's terms checked and fitted on them, and
published profiles imported as latency tables."""
