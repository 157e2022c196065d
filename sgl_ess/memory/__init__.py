"""Host memory that holds latent rows: memfd segments a worker process maps too (shared_segment.py)
and what every such mapping gets - no core dumps, size seals, optional mlock (protection.py).
Below every room of the data path (store, prefetch, kernels and integration all map it); torch
only for tensor views of a mapping."""
