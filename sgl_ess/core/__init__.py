"""Pure-Python policy code (no torch, no sglang): the LRU oracle and residency policy helpers,
how many ESS host pools a parallel layout puts on a node (parallel_layout.py), the hot slots each
request gets (hot_slots.py) and the SLO batch controller (slo_control.py)."""
