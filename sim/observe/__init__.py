"""Watching a replica step by step without slowing it: the observer hook, request
timelines, the TTFT diagnosis and its plain-English explanation, batch-slot records.

Observers see each accepted arrival and each plan (sim.observe.trace.StepObserver);
they never change what runs.
"""
