"""Pure-Python policy code (no torch, no sglang): the LRU oracle and residency policy helpers."""
