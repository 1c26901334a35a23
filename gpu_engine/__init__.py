"""The real PyTorch serving engine: a Llama-architecture model over paged KV tensors, driven by
sim.core's schedulers, built from a scenario by sim.assemble exactly as the simulator's replicas.

It never loads simpy or the SimPy world (sim.world): the engine keeps its own time
(gpu_engine.clock) through sim.core.drive, the step loop the tests use too.
"""
