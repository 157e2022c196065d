"""The DSA latent pool with ESS on: SGLang's own ``DSATokenToKVPool`` whose per-layer latent
buffers live in the ESS host pool instead of device memory.

Installed for pool kind "dsa" through ``KVCacheConfigurator._resolve_kv_pool_class`` (the hook
SGLang consults for out-of-tree pool classes) when ESS is on. ``_create_buffers`` - where the
parent would allocate ``[size + page, 1, kv_cache_dim]`` per layer on the device - allocates
one ``HostLatentPool`` (an anonymous shared-memory segment, page-locked in place on CUDA) and
makes each ``kv_buffer[layer]`` a view of its rows (excluded from core dumps, and mlocked with
``--ess-lock-host-memory``: sgl_ess.memory.protection):
  CPU   the host rows themselves
  CUDA  a zero-copy device view (UVA) of the registered host rows, so SGLang's own Triton
        writer (``set_mla_kv_buffer``) stores each new row straight into host memory
Nothing else changes: SGLang's allocator hands out host locations, ``req_to_token`` maps
tokens to them, the radix cache shares them, the index-key pool stays on the device.
PD transfer (``get_contiguous_buf_infos``, what SGLang registers with Mooncake / NIXL): the
latent buffers are given by their host addresses, never the device views, and are recorded here
(``host_spans``) so the registration marks them host memory (pd_layout.py: NIXL kind DRAM, as
SGLang does for HiSparse's host pool). The
store (``pool_adapter.EssPoolAdapter``) adopts ``ess_host_pool`` when the attention backend is
built. With attention TP > 1 the ranks of a node share one pool (shared_host_pool.py,
``ess_share``; on CUDA only with --ess-share-host-pool on): only its owner writes rows. Memory: owned by the pool object (so by SGLang's model runner), freed with the process.
"""

from __future__ import annotations

import logging

import torch

from sgl_ess.config import config_from_env

logger = logging.getLogger(__name__)

_classes: dict[type, type] = {}
# [start, end) byte ranges of every ESS host pool of this process (latent rows in host memory)
_host_spans: list[tuple[int, int]] = []


def note_host_span(start: int, nbytes: int) -> None:
    _host_spans.append((start, start + nbytes))


def is_host_address(ptr: int) -> bool:
    """`ptr` lies in an ESS host pool of this process."""
    return any(lo <= ptr < hi for lo, hi in _host_spans)


def host_backed(base: type) -> type:
    """A subclass of SGLang's DSA pool class `base` whose latent buffers are ESS host rows."""
    if base in _classes:
        return _classes[base]

    class EssHostDSATokenToKVPool(base):
        def _create_buffers(self):
            rows = self.size + self.page_size
            itemsize = torch.empty((), dtype=self.store_dtype).element_size()
            row_bytes = self.kv_cache_dim * itemsize
            on_cuda = str(self.device).startswith("cuda")
            cfg = config_from_env()
            lock = bool(cfg is not None and cfg.lock_host_memory)   # --ess-lock-host-memory
            from . import shared_host_pool

            # one pool per attention-TP group per node (shared_host_pool.py); ess_share None: this rank's own
            self.ess_host_pool, self.ess_share = shared_host_pool.build(
                self.layer_num, rows, row_bytes, on_cuda=on_cuda, lock=lock,
                share_mode=cfg.share_host_pool if cfg is not None else "auto")    # --ess-share-host-pool
            views = []
            for layer in range(self.layer_num):
                host = self.ess_host_pool.rows[layer]
                if on_cuda:
                    from sgl_ess.kernels.uva import device_view

                    host = device_view(host)
                views.append(host.view(self.store_dtype).view(rows, 1, self.kv_cache_dim))
            self.kv_buffer = views
            rows_t = self.ess_host_pool.rows
            note_host_span(rows_t.data_ptr(), rows_t.numel() * rows_t.element_size())
            logger.info("ESS host pool: %d layers x %d rows x %d B = %.2f GB in host memory%s, excluded from core "
                        "dumps%s", self.layer_num, rows, row_bytes, self.layer_num * rows * row_bytes / 1e9,
                        " (page-locked, zero-copy device views)" if on_cuda else "",
                        ", mlocked (--ess-lock-host-memory)" if lock else "")

        def get_contiguous_buf_infos(self):
            """What SGLang registers for PD transfer: each layer's latent rows at their HOST address
            (on CUDA `kv_buffer` is a device view of them: a transfer engine must register host memory),
            one page of rows per item."""
            rows = self.ess_host_pool.rows
            per_row = rows.shape[2] * rows.element_size()
            return ([rows[layer].data_ptr() for layer in range(self.layer_num)],
                    [rows[layer].numel() * rows.element_size() for layer in range(self.layer_num)],
                    [per_row * self.page_size] * self.layer_num)

    EssHostDSATokenToKVPool.__name__ = f"EssHost{base.__name__}"
    EssHostDSATokenToKVPool.__qualname__ = EssHostDSATokenToKVPool.__name__
    _classes[base] = EssHostDSATokenToKVPool
    return EssHostDSATokenToKVPool


def _around_resolve_kv_pool_class(original_fn, self, *args, kind=None, default=None, **kwargs):
    cls = original_fn(self, *args, kind=kind, default=default, **kwargs)
    if kind == "dsa":
        cfg = config_from_env()
        if cfg is not None and cfg.enabled:
            return host_backed(cls)
    return cls


def register() -> None:
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .. import targets

    HookRegistry.register(targets.RESOLVE_KV_POOL_CLASS, _around_resolve_kv_pool_class, HookType.AROUND)
