"""Shared-index layers (GLM-5.2: 78 layers, 21 with an indexer) through the store: the group design
(one LRU slot table per group, resolved once per step at the anchor, every layer's fetch planned at
the anchor's indexer hand-off) next to the per-layer design (one LRU per layer; a layer without an
indexer is planned inside its own attention, late). Part of `python -m bench store`.

The layer pattern is SGLang's own (srt/configs/model_config.dsa_layer_skips_topk on a GlmMoeDsaForCausalLM
config with index_topk_freq 4). Both designs run the same top-k trace on small rows (the counts do not
depend on the row width); the bytes every layer reads are checked equal, step by step. Reports plans
early / late per layer, resolver calls per step, and the CPU time of the planning (one run: a
single timing, not a distribution)."""
from __future__ import annotations

import time

import torch

GLM52_LAYERS, GLM52_FREQ = 78, 4


def glm52_anchors(layers: int = GLM52_LAYERS, freq: int = GLM52_FREQ) -> tuple[int, ...]:
    """Per layer, the layer whose top-k it uses, from SGLang's dsa_layer_skips_topk."""
    from sglang.srt.configs.model_config import dsa_layer_skips_topk
    from transformers import PretrainedConfig

    cfg = PretrainedConfig(architectures=["GlmMoeDsaForCausalLM"], index_topk=2048, num_hidden_layers=layers,
                           index_topk_freq=freq)
    out: list[int] = []
    for i in range(layers):
        out.append(out[-1] if i > 0 and dsa_layer_skips_topk(cfg, i) else i)
    return tuple(out)


def _run(anchors, grouped: bool, batch: int, k: int, n: int, context: int, steps: int, seed: int):
    from sgl_ess.store import LatentStore, RequestTable, StoreConfig

    layers = len(anchors)
    row = 32
    cfg = StoreConfig(num_layers=layers, row_bytes=row, host_capacity_tokens=batch * (context + steps) + 64,
                      hot_slots_per_request=n, max_requests=batch, topk=k, max_context_tokens=context + steps + 1,
                      ring_slots=batch * k, resolver_backend="torch", layer_anchors=anchors if grouped else ())
    store = LatentStore(cfg, transfer_backend="torch", engine="inline")
    table = RequestTable(store)
    ids = list(range(batch))
    for r in ids:
        table.add(r, context)
    for layer in range(layers):
        locs = table.req_to_host[:batch, :context].reshape(-1)
        store.host.rows[layer, locs] = (locs.unsqueeze(1) * 7 + layer + torch.arange(row)).remainder(251).to(torch.uint8)
    g = torch.Generator().manual_seed(seed)
    early, late = [0] * layers, [0] * layers
    reads, plan_s, calls = [], 0.0, []
    prev = torch.stack([torch.randperm(context, generator=g)[:k] for _ in ids])
    for _ in range(steps):
        pos = table.extend(ids)
        rows, lens = table.indices(ids), table.seq_lens(ids)
        before = store.resolver_calls
        plans, topk = {}, None
        for layer in range(layers):
            locs = table.req_to_host[rows, pos]
            new = (locs.unsqueeze(1) * 7 + layer + torch.arange(row)).remainder(251).to(torch.uint8)
            store.write_host(layer, locs, new)
            t0 = time.perf_counter()
            if anchors[layer] == layer:            # an indexer: a fresh top-k, handed off early
                topk = _next_topk(prev, pos, k, g)
                prev = topk
                if grouped:
                    group = store.cfg.group_layers(layer)
                    for lay, r in zip(group, store.reserve_group(layer, rows, pos, validate=False)):
                        store.write_slots(r, (locs.unsqueeze(1) * 7 + lay + torch.arange(row)).remainder(251)
                                          .to(torch.uint8))
                    for lay, st in zip(group, store.plan_group(layer, rows, lens, topk, table.req_to_host,
                                                              validate=False)):
                        plans[lay] = st
                        early[lay] += 1
                else:
                    store.write_slots(store.reserve(layer, rows, pos, validate=False), new)
                    plans[layer] = store.plan(layer, rows, lens, topk, table.req_to_host, validate=False)
                    early[layer] += 1
            elif not grouped:                      # no indexer: planned inside its attention
                store.write_slots(store.reserve(layer, rows, pos, validate=False), new)
                plans[layer] = store.plan(layer, rows, lens, topk, table.req_to_host, validate=False)
                late[layer] += 1
            plan_s += time.perf_counter() - t0
            st = plans.pop(layer)
            store.land(st)
            read = store.slot_rows[st.read_slots.long().clamp(min=0)]
            reads.append(read.clone())
            store.commit(st)
        calls.append(store.resolver_calls - before)
    store.shutdown()
    return {"early": early, "late": late, "calls": calls, "reads": reads, "plan_ms_per_step": plan_s * 1e3 / steps}


def _next_topk(prev: torch.Tensor, pos: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """Each request keeps ~80% of its previous top-k, fills the rest with fresh positions, and always
    selects its newest token `pos`: k unique positions < pos + 1."""
    out = []
    for old, p in zip(prev.tolist(), pos.tolist()):
        keep = [t for t, r in zip(old, torch.rand(len(old), generator=g).tolist()) if r < 0.8 and t != p]
        chosen = dict.fromkeys([p] + keep)
        while len(chosen) < k:
            chosen.setdefault(int(torch.randint(p, (1,), generator=g)))
        out.append(list(chosen)[:k])
    return torch.tensor(out, dtype=torch.int64)


def compare(batch: int = 4, k: int = 64, n: int = 192, context: int = 1024, steps: int = 6, seed: int = 0) -> dict:
    anchors = glm52_anchors()
    per_layer = _run(anchors, False, batch, k, n, context, steps, seed)
    group = _run(anchors, True, batch, k, n, context, steps, seed)
    n_anchor = len(set(anchors))
    shared = [i for i, a in enumerate(anchors) if a != i]

    def summary(r):
        return {"plans_early_layers": sum(1 for e, lt in zip(r["early"], r["late"]) if e and not lt),
                "plans_late_layers": sum(1 for lt in r["late"] if lt),
                "plans_early_by_layer": r["early"], "plans_late_by_layer": r["late"],
                "resolver_calls_per_step": sorted(set(r["calls"])),
                "plan_cpu_ms_per_step_single_run": r["plan_ms_per_step"]}
    return {"model": f"GLM-5.2-shaped: {len(anchors)} layers, {n_anchor} anchors (index_topk_freq {GLM52_FREQ}, "
                     f"SGLang's dsa_layer_skips_topk), {len(shared)} shared-index layers",
            "shape": {"batch": batch, "k": k, "slots": n, "context": context, "steps": steps},
            "per_layer_design": summary(per_layer), "group_design": summary(group),
            "outputs_equal": all(torch.equal(a, b) for a, b in zip(per_layer["reads"], group["reads"]))
            and len(per_layer["reads"]) == len(group["reads"]) == steps * len(anchors),
            "slot_tables": {"per_layer_design": len(anchors), "group_design": n_anchor}}
