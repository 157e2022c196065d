"""SGLang's memory pools and requests, tied to the ESS store.

  host_pool_class.py    SGLang's DSA pool class built host-backed: its latent buffers ARE the ESS host rows
  pool_adapter.py       adapter between SGLang's pools/requests and ``sgl_ess.store.LatentStore``
  lifecycle.py          opens and frees hot buffers / host rows on finish, abort, retract, flush
  shared_host_pool.py   one host pool per attention-TP group per node (memfd over SCM_RIGHTS, one writer)
  cuda_memory.py        CUDA: token-pool sizing without device latents; device_budget.py: the slot space in it
  pd_layout.py          PD: latent layout check at bootstrap; NIXL memory kinds of a host pool
  pd_warmup.py          PD: the prefill's warm hot-buffer state rides in SGLang's transfer
"""
