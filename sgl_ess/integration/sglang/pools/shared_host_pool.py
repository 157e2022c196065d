"""One ESS host pool per attention-TP group per node, shared by its ranks (issue 17).

MLA's latent row (and the indexer key) is the same on every attention-TP rank: SGLang's TP
ranks compute it from the same hidden state and each keeps a full copy. With ESS the copies
would be host pools, so TP 8 would keep 8 identical pools on a node. Instead:

  who shares   the ranks of one attention-TP group that run on the same node. "Node" is SGLang's
               ``--node-rank``, never the hostname, so two test "nodes" on one machine keep two
               pools. DP attention with one rank per attention group shares nothing.
  hand-over    the group's lowest rank on the node (the owner) creates the memfd pool; the others
               receive its file descriptor over an abstract AF_UNIX socket (SCM_RIGHTS) and map it.
               The socket's name travels through the group's own collective (gloo); nothing listens
               on a port, and the name dies with the owner.
  writes       only the owner writes latent rows and zeroes released ones (its allocator state,
               like every rank's, is the same: the ranks run the same batches in lockstep).
  ordering     every host row a reader reads was written in this forward's layer or before it. The
               owner publishes a per-layer count of forwards whose rows it has written (a tiny shared
               segment, stored after the rows); a reader, where the owner writes, waits for that
               count instead. Its later reads (this layer's rows, and every later fetch) follow the
               wait, so they follow the owner's writes, and the owner's zeroing of a released row
               before its next write (``fence_host``). Which waits and writes depends on the engine:
                 host     (CPU, the inline and worker engines: ``WriteEpochs``) the owner's host
                          stores the count after its rows; the reader's host spins on it. x86 keeps
                          stores in order (TSO); other CPUs would need a fence here.
                 stream   (the stream engine: ``StreamEpochs``) the owner's compute stream writes
                          the count after the kernel that stored the rows (a system-scope barrier
                          first); the reader's compute stream waits for it, so nothing blocks the
                          host (kernels/stream_values.py). The CPU suite runs it through the stream
                          runtime's double (the GPU fake); it has not run on a GPU.
  lockstep     every ``GUARD_EVERY`` forwards the members compare a hash of what they wrote
               (locations, request rows, sequence lengths: one device -> host copy per forward) and
               their per-layer counts; a mismatch stops the scheduler.
  hang bound   ``cuStreamWaitValue64`` has no timeout (the driver's wait flags are GEQ, EQ, AND, NOR and
               FLUSH; cuda-python offers no bounded form): a reader's stream waiting for a count the
               owner's stream is never given would hang the GPU, and the host with it at its next sync.
               So the owner's host also posts each count it queues (a second int64 [layers] in the same
               segment, stored by the host), and a reader's host queues a stream wait only once the
               owner's host has posted that count: a count mismatch (an owner that stopped, skipped a
               layer or ran fewer forwards) raises ``LockstepError`` on the reader's host after
               ``WAIT_TIMEOUT_S`` instead of queuing a wait nothing satisfies. What stays unbounded: a
               wait whose write is queued on the owner's stream but never runs (the owner's GPU hung or
               its process died after queuing it); the reader's stream then waits as it would on a
               collective. Cost: a reader's host follows the owner's host layer by layer (the GPUs are
               coupled the same way by the TP collectives).
  debug        ``SGLESS_SHARED_POOL_READONLY=1``: readers map the pool PROT_READ, so a write by a
               reader faults at once (the test suite runs with it).
Who shares (``--ess-share-host-pool``, core/parallel_layout.shares_host_pool): on CPU by default; on
CUDA only with ``on``, since the stream ordering has not run on a GPU: then every rank registers the
mapped pool (and the count) in its own process (cudaHostRegister; a read-only mapping as such) and
the stream engine is required (refused at start otherwise). ``off``: every rank its own pool.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
import zlib
from dataclasses import dataclass, field

import torch

from sgl_ess.store import HostLatentPool
from sgl_ess.memory.shared_segment import SharedSegment

logger = logging.getLogger(__name__)

ENV_READONLY = "SGLESS_SHARED_POOL_READONLY"
EPOCHS_LABEL = "sgl_ess_epochs"
EPOCHS_BYTES_PER_LAYER = 16      # the stream-written count and the owner's host-posted count, int64 each
GUARD_EVERY = 16                 # forwards between lockstep checks
WAIT_TIMEOUT_S = 120.0           # a reader waiting this long for the owner's rows: lockstep is lost
HANDOVER_TIMEOUT_S = 120.0


class LockstepError(RuntimeError):
    """The ranks sharing a host pool no longer run the same batches (or the owner stopped)."""


class WriteEpochs:
    """Per-layer count of forwards whose rows the owner has written (int64 [layers], shared); the
    host stores and waits for it (``order`` "host")."""
    order = "host"

    def __init__(self, segment: SharedSegment, layers: int):
        self.segment = segment
        self.shared = segment.tensor(torch.int64, (layers,))
        self.count = [0] * layers

    def written(self, layer: int) -> None:
        """Owner: this forward's rows of `layer` are in the pool."""
        self.count[layer] += 1
        self.shared[layer] = self.count[layer]

    def wait(self, layer: int, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        """Reader: return once the owner has written this forward's rows of `layer`."""
        self.count[layer] += 1
        _wait_posted(self.shared, layer, self.count[layer], timeout_s, "written")


class StreamEpochs:
    """The same count, written and waited for by the compute streams (``order`` "stream"): the
    owner's stream writes it after the kernel that stored the rows, a reader's stream waits for it
    before the kernels that read them. `runtime` is the stream engine's (prefetch/stream_runtime.py).

    `posted` (int64 [layers] in the same segment, host memory; None: no host check): the counts whose
    stream write the owner's host has queued. A reader's host waits (``WAIT_TIMEOUT_S``, then
    ``LockstepError``) until the owner posted the count it is about to wait for on its stream:
    ``cuStreamWaitValue64`` has no timeout, so a count nobody will write is refused here, on the host,
    before the stream wait is queued (see the module's "hang bound")."""
    order = "stream"

    def __init__(self, segment: SharedSegment, layers: int, runtime, count: list[int] | None = None,
                 posted: torch.Tensor | None = None):
        self.segment = segment
        self.shared = segment.tensor(torch.int64, (layers,))
        self.rt = runtime
        self.values = runtime.map_values(self.shared)
        self.count = list(count) if count is not None else [0] * layers
        self.posted = posted

    def written(self, layer: int) -> None:
        self.count[layer] += 1
        self.rt.write_value(self.rt.current(), self.values, layer, self.count[layer])
        if self.posted is not None:
            self.posted[layer] = self.count[layer]      # after the stream write is queued

    def wait(self, layer: int, timeout_s: float = WAIT_TIMEOUT_S) -> None:
        self.count[layer] += 1
        want = self.count[layer]
        if self.posted is not None:
            _wait_posted(self.posted, layer, want, timeout_s, "queued the stream write of")
        self.rt.wait_value(self.rt.current(), self.values, layer, want)


def _wait_posted(counts: torch.Tensor, layer: int, want: int, timeout_s: float, what: str) -> None:
    """Spin until the owner's host stored `want` (or more) at counts[layer]; LockstepError after
    `timeout_s` (a plain host read of shared memory: no device sync)."""
    spins, deadline = 0, None
    while int(counts[layer]) < want:
        spins += 1
        if spins > 1000:
            if deadline is None:
                deadline = time.monotonic() + timeout_s
            elif time.monotonic() > deadline:
                raise LockstepError(
                    f"ESS shared host pool: waited {timeout_s:g} s for the owner to have {what} layer {layer}'s "
                    f"rows (forward {want}, owner at {int(counts[layer])}): the TP ranks are out of lockstep "
                    "or the owner rank stopped")
            time.sleep(0.0002)


@dataclass
class Share:
    """How this rank takes part in its node's shared pool."""
    writer: bool
    members: list[int]                  # ranks in the attention-TP group that share this pool
    group_rank: int
    node_rank: int
    inode: int
    epochs: WriteEpochs | StreamEpochs
    group: object = field(repr=False)   # SGLang's GroupCoordinator (its gloo cpu group)
    readonly: bool = False
    posted: bool = False                # the count segment holds the owner's posted counts (StreamEpochs)
    _forwards: int = 0
    _digest: int = 0

    def order_on(self, runtime) -> None:
        """The store runs on the stream engine: order through its compute streams from now on (with the
        host check of posted counts when the segment holds them: `build` makes it so)."""
        if isinstance(self.epochs, WriteEpochs):
            e = self.epochs
            layers = len(e.count)
            posted = e.segment.tensor(torch.int64, (layers,), offset_bytes=8 * layers) if self.posted else None
            self.epochs = StreamEpochs(e.segment, layers, runtime, e.count, posted=posted)

    def before_read(self, layer: int) -> None:
        if not self.writer:
            self.epochs.wait(layer)

    def after_write(self, layer: int) -> None:
        if self.writer:
            self.epochs.written(layer)

    def check_lockstep(self, loc: torch.Tensor, reqs: torch.Tensor, seq_lens: torch.Tensor) -> None:
        """Once per forward (layer 0): fold what this forward writes into a digest - the three tensors
        joined on their device and read back in ONE device -> host copy (a host sync: SGLang's forward
        inputs are on the device), their lengths folded in from the host so a boundary shift differs;
        every GUARD_EVERY forwards compare the digest and the per-layer counts across the group (one
        small collective)."""
        parts = [t.detach().reshape(-1) for t in (loc, reqs, seq_lens)]
        joined = torch.cat([p.to(torch.int64) for p in parts]).cpu()
        d = zlib.crc32(repr([p.numel() for p in parts]).encode(), self._digest)
        d = zlib.crc32(joined.numpy().tobytes(), d)
        self._digest, self._forwards = d, self._forwards + 1
        if self._forwards % GUARD_EVERY:
            return
        got = self.group.all_gather_object((self.node_rank, self._forwards, d, tuple(self.epochs.count)))
        mine = [g for g in got if g[0] == self.node_rank]
        if any(g[1:] != mine[0][1:] for g in mine):
            raise LockstepError(f"ESS shared host pool: the TP ranks sharing node {self.node_rank}'s pool wrote "
                                f"different rows (forward, digest, per-layer counts per rank: "
                                f"{[g[1:] for g in mine]}); stopping "
                                "rather than reading rows another rank did not write")

    def describe(self) -> dict:
        return {"host_pool_role": "writer" if self.writer else "reader", "host_pool_inode": self.inode,
                "host_pool_members": list(self.members), "host_pool_readonly": self.readonly,
                "host_pool_order": self.epochs.order}


def _node_rank() -> int:
    from sglang.srt.runtime_context import get_server_args

    return int(getattr(get_server_args(), "node_rank", 0) or 0)


def _send_fds(server: socket.socket, n_peers: int, fds: list[int]) -> None:
    server.settimeout(HANDOVER_TIMEOUT_S)
    for _ in range(n_peers):
        conn, _ = server.accept()
        with conn:
            socket.send_fds(conn, [b"sgl-ess host pool"], fds)


def _recv_fds(name: str, n: int) -> list[int]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(HANDOVER_TIMEOUT_S)
        s.connect("\0" + name)
        _, fds, _, _ = socket.recv_fds(s, 64, n)
    if len(fds) != n:
        raise RuntimeError(f"ESS shared host pool: received {len(fds)} file descriptors from the owner; expected {n}")
    return fds


def build(layers: int, rows: int, row_bytes: int, *, on_cuda: bool, lock: bool,
          share_mode: str = "auto") -> tuple[HostLatentPool, Share | None]:
    """The host pool of this rank: its own, or its node's shared one (`share_mode`:
    --ess-share-host-pool). Every rank of the attention-TP group must call this at the same point
    (SGLang builds the pools in lockstep)."""
    from sglang.srt.distributed.parallel_state import get_attn_tp_group

    from sgl_ess.core.parallel_layout import shares_host_pool

    group = get_attn_tp_group()
    if group.world_size <= 1 or not shares_host_pool(share_mode, on_cuda):
        if group.world_size > 1:
            logger.info("ESS host pool: one per rank (--ess-share-host-pool %s%s): the %d attention-TP ranks each "
                        "keep a copy", share_mode, " on CUDA: the stream ordering a shared pool needs has not run "
                        "on a GPU; `on` shares it" if share_mode == "auto" else "", group.world_size)
        return HostLatentPool(layers, rows, row_bytes, pin=on_cuda, lock=lock), None
    node = _node_rank()
    me = group.rank_in_group
    infos = group.all_gather_object(node)
    members = [r for r, n in enumerate(infos) if n == node]
    writer = me == members[0]
    readonly = os.environ.get(ENV_READONLY) == "1"
    name = f"sgl_ess_pool_{os.getpid()}_{uuid.uuid4().hex[:12]}" if writer else None
    server = None
    if writer:
        pool = HostLatentPool(layers, rows, row_bytes, pin=on_cuda, lock=lock)
        epochs_seg = SharedSegment(EPOCHS_BYTES_PER_LAYER * layers, label=EPOCHS_LABEL)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind("\0" + name)
        server.listen(len(members))
    names = group.all_gather_object(name)
    try:
        if writer:
            _send_fds(server, len(members) - 1, [pool.segment.fd, epochs_seg.fd])
        else:
            host_fd, epochs_fd = _recv_fds(names[members[0]], 2)
            pool = HostLatentPool(layers, rows, row_bytes, pin=on_cuda, lock=lock, fd=host_fd, readonly=readonly)
            epochs_seg = SharedSegment.attach(epochs_fd, EPOCHS_BYTES_PER_LAYER * layers, label=EPOCHS_LABEL)
    finally:
        if server is not None:
            server.close()
    inode = os.fstat(pool.segment.fd).st_ino
    inodes = group.all_gather_object((node, inode))
    if len({i for n, i in inodes if n == node}) != 1:
        raise RuntimeError(f"ESS shared host pool: ranks on node {node} mapped different segments {inodes}")
    share = Share(writer=writer, members=members, group_rank=me, node_rank=node, inode=inode,
                  epochs=WriteEpochs(epochs_seg, layers), group=group, readonly=readonly and not writer,
                  posted=True)
    logger.info("ESS host pool: shared by attention-TP ranks %s on node %d (this rank: %s; memfd inode %d)",
                members, node, "owner, writes and zeroes" if writer else
                "reader" + (", mapped read-only" if share.readonly else ""), inode)
    return pool, share
