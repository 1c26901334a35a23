"""An OpenAI-compatible server over a serving loop, and a load generator for any such server.

`servesim serve` (sim.serve.server) runs a scenario's scheduler on the wall
clock behind `/v1/completions` and `/v1/chat/completions`: the simulated
backend (sim.serve.simulated) holds each step for its predicted latency, the
engine's (sim.cli.serve_engine) runs it on real kernels; both go through
the same loop (sim.serve.loop; its arrival instants sim.serve.arrivals, its
backend interface sim.serve.stepper, n > 1 split by sim.serve.parallel). The
routes are sim.serve.app's, their bodies sim.serve.responses', the key check
sim.serve.auth's; a request is read by sim.serve.api and
sim.serve.request_fields. What each request field gets is
sim.serve.fields' table; /metrics is vLLM's (sim.serve.metrics), KV-cache
events too (sim.serve.kv_events), and `--replicas` serves a fleet
(sim.serve.fleet). `servesim load` (sim.serve.load) replays a scenario's
workload against any OpenAI-compatible endpoint, measures it from the
client's side, and writes vLLM bench's result file (sim.serve.bench).
"""
