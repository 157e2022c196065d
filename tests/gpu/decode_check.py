"""The body of tests/gpu/test_store_stream_cuda.py::test_decode_on_cuda_matches_reference, shared with its
CPU run through the stream double (tests/unit/store/test_decode_check_gpu_fake.py), so the logic that
runs on a GPU is the logic the CPU suite checks (issue 32, defect 5: for dba both halves were checked
against the last snapshot, taken after half 0's commit had zeroed its ring rows - it could not pass).

A step's rows are snapshotted inside attention (the rows the kernel reads); each plan is checked
against the last snapshot taken before its own commit (on_event "commit"), never a later one."""
from __future__ import annotations

from typing import Callable

import torch

from sgl_ess.attention.overlap import decode_layer, plan_layer
from tests.unit.kernels.attention_bounds import plan_reference


def decode_matches_reference(store, tab, lay, mode: str, attend, sync: Callable[[], None], *, contexts, steps: int,
                             k: int, scale: float, heads: int = 16, seed: int = 0,
                             host_blocks: Callable[[], None] = lambda: None) -> None:
    """Decode `steps` steps of every request in `contexts` through the store at overlap level `mode`;
    attention (`attend(q, rows, slots) -> (out, lse)`, on the store's device) equals the unsplit torch
    reference within the fp32 bound and reads the latent its top-k position names. `sync()` waits for
    the device (torch.cuda.synchronize, or the double's finish). `host_blocks()` is called where the
    snapshot's device -> host copy blocks the host: on a GPU the side streams may run any queued work
    meanwhile (a commit of the plan before), which the copy does not wait for; the double's finish
    runs it all there (the worst case)."""
    dev = store.slot_rows.device
    layers = store.cfg.num_layers
    g = torch.Generator().manual_seed(seed)
    ids = list(range(len(contexts)))
    lat = {i: [torch.randn(c + steps, lay.dim, generator=g) for _ in range(layers)] for i, c in zip(ids, contexts)}
    for i, c in zip(ids, contexts):
        tab.add(i, c)
        for layer in range(layers):
            store.write_host(layer, tab.host_locs(i), lay.encode(lat[i][layer][:c]).to(dev))
    for _ in range(steps):
        pos = tab.extend(ids)
        reqs, lens = tab.indices(ids), tab.seq_lens(ids)
        q = torch.randn(len(ids), heads, lay.dim, generator=g)
        for layer in range(layers):
            new = lay.encode(torch.stack([lat[i][layer][int(pos[j])] for j, i in enumerate(ids)]))
            store.append(layer, reqs, pos, new.to(dev), tab.req_to_host)
            topk = torch.stack([torch.cat([pos[j:j + 1].cpu(), torch.randperm(int(lens[j]) - 1, generator=g)[:k - 1]])
                                for j in range(len(ids))])
            plans = plan_layer(store, mode, layer, reqs, lens, topk.to(dev), tab.req_to_host, validate=False)
            snaps, snap_of = [], []         # every snapshot; per plan, the last one before its commit

            def on_event(what, step):
                if what == "commit":
                    snap_of.append(snaps[-1])

            out = decode_layer(store, mode, q.to(dev), plans,
                               lambda qq, rows, sl: (host_blocks(), snaps.append(rows.cpu().clone()),
                                                     attend(qq, rows, sl))[2],
                               on_event=on_event)
            sync()
            assert len(snap_of) == len(plans)
            start = 0
            got_rows = []
            for sp, snap in zip(plans, snap_of):   # each plan against the unsplit torch reference
                b = sp.reqs.numel()
                want, _, tol = plan_reference(lay, q[start:start + b], snap, sp.read_slots, sp.staged,
                                              scale, dual=mode != "none")
                err = (out[start:start + b].cpu().double() - want.double()).abs()
                assert bool((err <= tol).all()), f"layer {layer}, plan of rows {start}..{start + b}: over the bound"
                got_rows.append(lay.decode(snap[sp.read_slots.cpu().clamp(min=0).long()]))
                start += b
            # and the rows are the right ones: each entry reads the latent its top-k position names
            dec = [lay.decode(lay.encode(lat[i][layer])) for i in ids]
            want_rows = torch.stack([dec[j][topk[j]] for j in range(len(ids))])
            assert torch.equal(torch.cat(got_rows), want_rows)
    for i in ids:
        tab.release(i)
    sync()
    assert int(store.host.rows.sum()) == 0
