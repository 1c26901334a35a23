"""What a user writes, validated: the scenario schema, its loader and error text, the model and
GPU specs with their catalogues, and the cost formulas over them.

Everything above this package (workloads, latency models, the worlds) reads a
validated `Scenario` or a spec; nothing here runs a simulation. Import the
modules themselves (`sim.config.loader`, `sim.config.scenario`, ...): this
package re-exports nothing, so loading a spec never loads the schema.
"""
