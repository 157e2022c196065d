"""The ESS latent store: host pool, device hot buffers, exact-LRU resolver, FlashTrans moves."""
from sgl_ess.store.config import PAPER_MIN_HOT_SLOTS, StoreConfig, StoreConfigError, hot_slots_for
from sgl_ess.store.host_pool import HostLatentPool, HostPoolFullError
from sgl_ess.store.latent_store import LatentStore
from sgl_ess.store.requests import RequestTable

__all__ = ["LatentStore", "StoreConfig", "StoreConfigError", "hot_slots_for", "HostLatentPool",
           "HostPoolFullError", "RequestTable", "PAPER_MIN_HOT_SLOTS"]
