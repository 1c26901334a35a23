"""An OpenAI-compatible server over a serving loop, and a load generator for any such server.

`servesim serve` (sim.serve.server) runs a scenario's scheduler on the wall
clock behind `/v1/completions` and `/v1/chat/completions`: the simulated
backend (sim.serve.simulated) holds each step for its predicted latency, the
engine's (sim.cli.serve_engine) runs it on real kernels; both go through
the same loop (sim.serve.loop). `servesim load` (sim.serve.load) replays a
scenario's workload against any OpenAI-compatible endpoint and measures it
from the client's side.
"""
