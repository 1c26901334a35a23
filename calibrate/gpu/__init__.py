"""The one-script GPU check (`python -m calibrate.gpu.check`): correctness and speed on the
device, a profile and fit per model, the engine's replay of a committed plan (plans/*.json);
then, where the simulator runs, the fidelity reports from its files (`calibrate.gpu.report`).

Everything that runs on the GPU machine needs torch and the project only: no simpy, no pydantic.
"""
