"""Attention backends and the request lifecycle through the store.

  store_forward.py         the one request lifecycle (extend, mixed, verify, decode) both backends call
  query_layout.py          where each forward mode's queries sit; the backends' roles (target, draft)
  padding.py               SGLang's padding rows (DP attention, TBO, graphs) cut off before the store
  ess_backend.py           the ``ess`` sparse-MLA backend (CPU torch kernels; ESS off: SGLang's pool)
  cuda_backend.py          CUDA: SGLang's DSA backend through store_forward (FlashMLA / Triton); GPU fakes only here
  backend_registration.py  registers ``ess`` and builds the store in each scheduler
  indexer_torch.py         exact pure-torch DSA lightning indexer; hands a decode top-k to the store early
  eagle.py                 EAGLE / NextN (MTP) draft backends with ESS (speculative *decoding*; the store's
                           speculative *prefetch* tier is sgl_ess/store/speculative.py)
  eagle_cpu_kernels.py     torch versions of the sgl-kernel ops SGLang's EAGLE path calls on CPU
  cpu_fixes.py             what SGLang needs to run a DSA model without CUDA (capability probe, absorbed MLA)
"""
