"""The engine measured into tables: which step shapes (grid), the engine parts that run them
(rig), each point shaped and timed (shaping), the profile run (run), and tables from a known
cost for tests (synthetic)."""
