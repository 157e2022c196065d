"""ATen ops and host reads per decode layer-step of the store's device path, counted on CPU.

What one layer-step of the CUDA decode runs through the store: reserve (the newest row's slot),
plan (resolve the top-k, submit the misses' fetch), land (wait for it), commit (stage rows into
the hot buffer), with `validate=False` (the CUDA path skips the input checks) and the side-stream
engine (stream_engine.StreamEngine; here its streams run each kernel at once on the host: a
count, not a timing). The torch profiler records the ATen ops the Python code calls (top level:
an op inside another op is not counted again).

  ops               top-level ATen ops per layer-step (all of them)
  launch_estimate   the ops that are not pure metadata (views, reshapes, empty allocations), with
                    each call of a kernel that is one Triton launch on CUDA counted once (KERNELS:
                    the resolver, the plan epilogue, FlashTrans copy / move); their torch
                    references run here. An estimate, not a launch count: host-to-device index
                    copies are no-ops on CPU
  kernel_calls      those one-launch kernel calls, by name
  resolver_ops      of `ops`, those inside the resolver (the torch order-list path on CPU)
  host_reads        aten::item / aten::_local_scalar_dense (a device -> host read on CUDA; a
                    .tolist() or a .cpu() of a device tensor is not seen on CPU)
Goal in issue 16: <= 10 launches and no host read per layer-step. Reported, not asserted.
"""
from __future__ import annotations

import collections

import torch

METADATA_OPS = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::_unsafe_view", "aten::select", "aten::slice",
    "aten::expand", "aten::as_strided", "aten::unsqueeze", "aten::squeeze", "aten::t", "aten::permute",
    "aten::transpose", "aten::alias", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::detach",
    "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::to", "aten::_to_copy_noop",
    "aten::split", "aten::unbind", "aten::chunk", "aten::narrow", "aten::contiguous", "aten::result_type",
}
HOST_READS = {"aten::item", "aten::_local_scalar_dense"}
# (module, function, label): each is one Triton launch on CUDA; here its torch reference runs
KERNELS = [("sgl_ess.store.latent_store", "assign", "resolver"),
           ("sgl_ess.store.latent_store", "plan_epilogue_torch", "plan_epilogue"),
           ("sgl_ess.prefetch.stream_engine", "copy_rows", "flashtrans_copy"),
           ("sgl_ess.prefetch.stream_engine", "move_rows", "flashtrans_move"),
           ("sgl_ess.store.latent_store", "copy_rows", "flashtrans_copy")]      # the padded newest-row write


class HostStreams:
    """The stream runtime with every kernel run at once on the host (CPU op counting only)."""
    requires_cuda = False

    class _Event:
        def query(self):
            return True

    def stream(self, priority):
        return priority

    def current(self):
        return "compute"

    def wait_stream(self, a, b):
        pass

    def record(self, s):
        return self._Event()

    def wait_event(self, s, ev):
        pass

    def launch(self, s, fn):
        return fn()

    def keep_alive(self, t, s):
        pass


def _top_level(events):
    out = []
    for e in events:
        if not e.name.startswith("aten::"):
            continue
        p = e.cpu_parent
        while p is not None and not p.name.startswith("aten::"):
            p = p.cpu_parent
        if p is None:
            out.append(e)
    return out


def _launches(e) -> bool:
    """Does this top-level op run a kernel? A metadata op does only when something under it does
    (aten::to that copies runs aten::_to_copy; a reshape that copies runs aten::clone)."""
    if e.name not in METADATA_OPS:
        return True
    return any(c.name.startswith("aten::") and _launches(c) for c in e.cpu_children)


def _under(e, name):
    p = e.cpu_parent
    while p is not None:
        if p.name == name:
            return True
        p = p.cpu_parent
    return False


def count_plan_ops(batch: int = 8, k: int = 64, slots: int = 256, context: int = 2048, steps: int = 3,
                   seed: int = 0, padded: int = 0) -> dict:
    """Per layer-step counts of a warm decode step (after `steps - 1` steps of the same shape).
    `padded` > 0: the step a decode CUDA graph holds (--ess-cuda-graph): the batch's last `padded`
    rows are padding (request -1, as a graph pads its batch), the store called with padded=True."""
    from sgl_ess.prefetch.stream_engine import StreamEngine
    from sgl_ess.store import LatentStore, RequestTable, StoreConfig

    cfg = StoreConfig(num_layers=1, row_bytes=656, host_capacity_tokens=batch * (context + steps) + 64,
                      hot_slots_per_request=slots, max_requests=batch, topk=k, max_context_tokens=context + steps)
    store = LatentStore(cfg, transfer_backend="torch", engine="inline")   # resolver: numba on CPU, Triton on CUDA
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=HostStreams(), zero_backend="torch")
    table = RequestTable(store)
    g = torch.Generator().manual_seed(seed)
    ids = list(range(batch))
    for i in ids:
        table.add(i, context)
    originals = _label_kernels()
    try:
        prof = None
        for step in range(steps):
            pos = table.extend(ids)
            reqs, lens = table.indices(ids), table.seq_lens(ids)
            topk = torch.stack([torch.cat([pos[j:j + 1], torch.randperm(int(lens[j]) - 1, generator=g)[:k - 1]])
                                for j in range(batch)])
            new = torch.randint(0, 256, (batch, 656), dtype=torch.uint8, generator=g)
            locs = table.req_to_host[reqs, pos]
            store.write_host(0, locs, new)                 # SGLang's writer (not part of the step)
            if padded:
                real = torch.arange(batch) < batch - padded
                reqs = torch.where(real, reqs, -1)
                lens, pos = torch.where(real, lens, 1), torch.where(real, pos, 0)
                topk = torch.where(real.unsqueeze(1), topk, -1)

            def layer_step():
                rows = store.reserve(0, reqs, pos, validate=False, padded=bool(padded))
                store.write_slots(rows, new, padded=bool(padded))   # as pool_adapter.decode writes the newest rows
                sp = store.plan(0, reqs, lens, topk, table.req_to_host, validate=False, padded=bool(padded))
                store.land(sp)
                store.commit(sp)

            if step < steps - 1:
                layer_step()
                continue
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                layer_step()
    finally:
        _restore(originals)
        store.shutdown()
    events = prof.events()
    top = _top_level(events)
    names = collections.Counter(e.name for e in top)
    kernel = lambda e: any(_under(e, "sgl_ess::kernel::" + label) for _, _, label in KERNELS)  # noqa: E731
    calls = collections.Counter(e.name.rsplit("::", 1)[1] for e in events
                                if e.name.startswith("sgl_ess::kernel::") and not _in_kernel(e))
    launches = [e for e in top if _launches(e)]
    return {
        "shape": {"batch": batch, "k": k, "hot_slots": slots, "context": context},
        "ops": len(top), "resolver_ops": sum(1 for e in top if _under(e, "sgl_ess::kernel::resolver")),
        "launch_estimate_cpu_path": len(launches),
        "launch_estimate_cuda": sum(1 for e in launches if not kernel(e)) + sum(calls.values()),
        "kernel_calls": dict(calls),
        "host_reads": sum(names[n] for n in HOST_READS),
        "top_ops": dict(names.most_common(12)),
    }


def _label_kernels() -> list:
    """Wrap each KERNELS function in a record_function region 'sgl_ess::kernel::<label>'; returns
    what `_restore` puts back."""
    import importlib

    originals = []
    for mod_name, fn, label in KERNELS:
        mod = importlib.import_module(mod_name)
        original = getattr(mod, fn, None)
        if original is None:            # an older tree without this kernel (before/after comparisons)
            continue
        originals.append((mod, fn, original))

        def labelled(*a, _f=original, _label=label, **kw):
            with torch.profiler.record_function("sgl_ess::kernel::" + _label):
                return _f(*a, **kw)
        setattr(mod, fn, labelled)
    return originals


def _restore(originals) -> None:
    for mod, fn, original in originals:
        setattr(mod, fn, original)


def _in_kernel(e) -> bool:
    """A kernel region inside another one (e.g. a copy the resolver's torch path makes) is not a launch."""
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("sgl_ess::kernel::"):
            return True
        p = p.cpu_parent
    return False


# --- prefill (extend) layer-step ------------------------------------------------------------------
# Device -> host syncs on CUDA: a scalar read (item, int(), bool(), float() of a tensor: each ends in
# aten::_local_scalar_dense) or an op whose output size depends on the data (boolean-mask indexing and
# torch.nonzero: aten::nonzero; masked_select; repeat_interleave with tensor repeats), counted where it
# is outermost (one sync however many ops run inside it), plus Tensor.tolist / .cpu / .numpy calls,
# which run no ATen op on a CPU tensor and are counted by wrapping them. On CPU every tensor is a
# host tensor, so a read of a tensor that also lives on the host on CUDA would be counted too: each
# counted site is listed (`sync_sites`: the line of a Tensor.tolist / .cpu / .numpy call; for an ATen
# sync, the sgl_ess function it ran in, by the line of its def) so a reader can tell.
SYNC_OPS = {"aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select", "aten::repeat_interleave"}
HOST_COPIES = ("tolist", "cpu", "numpy")


class _Mode:
    """An EXTEND forward mode (the three questions StoreForward.extend and query_layout ask)."""

    def is_decode_or_idle(self):
        return False

    def is_target_verify(self):
        return False

    def is_draft_extend_v2(self):
        return False


def _site(stack) -> str:
    """The innermost sgl_ess / bench frame of a Python stack: 'path:line'."""
    for frame in stack:
        where = frame if isinstance(frame, str) else f"{frame.filename}:{frame.lineno}"
        if ("sgl_ess/" in where or "bench/" in where) and "op_count.py" not in where:
            return where[where.find("sgl_ess/") if "sgl_ess/" in where else where.find("bench/"):]
    return "?"


def _event_site(e) -> str:
    """The innermost sgl_ess / bench Python frame above a profiler event (with_stack=True records
    Python calls as parent events named 'path(line): function')."""
    p = e.cpu_parent
    while p is not None:
        if "sgl_ess/" in p.name or "bench/" in p.name:
            name = p.name[p.name.find("sgl_ess/") if "sgl_ess/" in p.name else p.name.find("bench/"):]
            where, _, fn = name.partition(": ")
            return f"in {fn}() defined at {where.replace('(', ':').rstrip(')')}"
        p = p.cpu_parent
    return "?"


def _outermost_syncs(events) -> list:
    out = []
    for e in events:
        if e.name not in SYNC_OPS:
            continue
        p = e.cpu_parent
        while p is not None and p.name not in SYNC_OPS:
            p = p.cpu_parent
        if p is None:
            out.append(e)
    return out


def count_extend_syncs(batch: int = 4, chunk: int = 64, context: int = 512, k: int = 32, slots: int = 128,
                       warmup_queries: int = 8) -> dict:
    """Device -> host syncs per prefill (extend) layer-step of the ESS path, counted on CPU.

    The real code runs: StoreForward.extend (the CUDA class's extend, store_forward.py) with SGLang's
    prefill kernel replaced by zeros, and EssPoolAdapter.after_extend / mtp_reset (open and warm the
    hot buffers from the chunk's last W queries) on a LatentStore with the side-stream engine on
    host streams. A batch of `batch` requests each extends `chunk` tokens onto `context - chunk`
    cached ones. Layer 0 runs first, unprofiled (it opens the rows and fills the per-forward caches:
    query layout, real rows, riding rows); layer 1, a steady layer, is counted."""
    import threading
    import types

    from sgl_ess.integration.sglang.backends.store_forward import StoreForward
    from sgl_ess.integration.sglang.pools.pool_adapter import EssPoolAdapter
    from sgl_ess.prefetch.stream_engine import StreamEngine
    from sgl_ess.store import LatentStore, RequestTable, StoreConfig

    cfg = StoreConfig(num_layers=2, row_bytes=656, host_capacity_tokens=batch * context + 64,
                      hot_slots_per_request=slots, max_requests=batch, topk=k, max_context_tokens=context,
                      warmup_window=warmup_queries)
    store = LatentStore(cfg, transfer_backend="torch", engine="inline")
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=HostStreams(), zero_backend="torch")
    table = RequestTable(store)
    ids = list(range(batch))
    for i in ids:
        table.add(i, context)

    class Ess:      # the adapter's own extend methods over this store
        after_extend = EssPoolAdapter.after_extend
        mtp_reset = EssPoolAdapter.mtp_reset
        _committed_rows = EssPoolAdapter._committed_rows
        is_open = EssPoolAdapter.is_open

        def __init__(self):
            self.store, self.store_cfg, self.layers, self._lock = store, cfg, cfg.num_layers, threading.RLock()
            self.validate = False       # as on CUDA (the adapter validates on a CPU device only)

    g = torch.Generator().manual_seed(0)
    reqs = torch.tensor(ids, dtype=torch.int64)
    seq = torch.full((batch,), context, dtype=torch.int64)
    n_tok = batch * chunk
    pos = torch.arange(context - chunk, context).repeat(batch)
    topk = torch.stack([torch.randperm(int(p) + 1, generator=g)[:k] if int(p) + 1 >= k else
                        torch.cat([torch.arange(int(p) + 1), torch.full((k - int(p) - 1,), -1)]) for p in pos])
    fb = types.SimpleNamespace(
        forward_mode=_Mode(), req_pool_indices=reqs, seq_lens=seq, seq_lens_cpu=seq.clone(),
        extend_seq_lens=torch.full((batch,), chunk), extend_seq_lens_cpu=[chunk] * batch,
        out_cache_loc=table.req_to_host[reqs.unsqueeze(1), pos.view(batch, chunk)].reshape(-1) + 1,
        global_num_token_non_padded_cpu=n_tok)
    heads, r = 2, 16
    kernels = types.SimpleNamespace(prefill=lambda q, layer, b, tk, tok_req, token_idx, **kw:
                                    torch.zeros(q.shape[0], heads * r))
    backend = types.SimpleNamespace(spec_role=None, token_to_kv_pool=None)
    sf = StoreForward(Ess(), types.SimpleNamespace(req_to_token=table.req_to_host), kernels, backend, r, 8)
    q = torch.zeros(n_tok, heads * (r + 8))
    counts, sites = collections.Counter(), collections.Counter()
    originals = {name: getattr(torch.Tensor, name) for name in HOST_COPIES}

    def counted(name):
        def read(self, *a, **kw):
            counts[name] += 1
            import traceback
            sites[f"{_site(reversed(traceback.extract_stack()[:-1]))} ({name})"] += 1
            return originals[name](self, *a, **kw)
        return read

    labelled = _label_kernels()
    try:
        sf.extend(q, types.SimpleNamespace(layer_id=0), fb, topk)
        for name in HOST_COPIES:
            setattr(torch.Tensor, name, counted(name))
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True) as prof:
            sf.extend(q, types.SimpleNamespace(layer_id=1), fb, topk)
    finally:
        for name, fn in originals.items():
            setattr(torch.Tensor, name, fn)
        _restore(labelled)
        store.shutdown()
    syncs = [e for e in _outermost_syncs(prof.events()) if not _in_kernel(e)]
    for e in syncs:
        sites[f"{_event_site(e)} ({e.name.split('::')[1]})"] += 1
    return {
        "shape": {"batch": batch, "chunk_tokens": chunk, "context": context, "k": k, "hot_slots": slots,
                  "warmup_queries": warmup_queries},
        "syncs": len(syncs) + sum(counts.values()),
        "scalar_and_shape_syncs": len(syncs), "host_copies": dict(counts),
        "sync_sites": dict(sorted(sites.items())),
    }
