"""The SimPy world: arrivals -> router -> replicas, one event per engine step.

A replica's scheduler, pool and latency model come from sim.assemble; this
package only keeps simulated time, routes, and draws speculative acceptances.
Only the simulator imports it: the engine (gpu_engine) keeps its own time.
"""
