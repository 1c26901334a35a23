"""The real PyTorch serving engine (built in a later issue); it runs sim.core's schedulers."""
