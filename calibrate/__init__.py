"""Calibration: measure the engine, fit latency tables, validate the simulator against it."""
