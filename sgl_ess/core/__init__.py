"""Pure-Python policy code (no torch, no sglang): the LRU oracle and residency policy helpers,
and how many ESS host pools a parallel layout puts on a node (parallel_layout.py)."""
