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
        for mod, fn, original in originals:
            setattr(mod, fn, original)
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


def _in_kernel(e) -> bool:
    """A kernel region inside another one (e.g. a copy the resolver's torch path makes) is not a launch."""
    p = e.cpu_parent
    while p is not None:
        if p.name.startswith("sgl_ess::kernel::"):
            return True
        p = p.cpu_parent
    return False
