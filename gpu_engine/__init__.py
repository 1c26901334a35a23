"""The real PyTorch serving engine: a Llama-architecture model over paged KV tensors, driven by
sim.core's schedulers, built from a scenario by sim.assemble exactly as the simulator's replicas.
"""
