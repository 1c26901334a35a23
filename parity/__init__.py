"""Step-for-step parity of servesim's continuous scheduler with vLLM's own v1 Scheduler.

Both sides run the same seeded configurations (configs.py) through the same
clock-free step loop and write the same trace format (trace.py); compare.py
finds the first step where they differ. The vLLM side (record_vllm.py) runs in
its own venv (setup_vllm.sh) and must not import servesim's simulator; the
servesim side (servesim_side.py) needs only sim.core. NOTES.md holds the
measurements and what sim/core changed; docs/vllm_parity.md the summary.
"""
