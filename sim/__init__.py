"""servesim: a discrete-event simulator of LLM serving, calibrated on a real engine."""

__version__ = "0.1.0"
