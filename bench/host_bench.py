"""python -m bench host: host time per decode layer-step of the ESS CUDA class next to SGLang's own DSA
backend with ESS off, both in the GPU fake (tests/integration/_cuda_fake.py: SGLang's real DSA backend
code, FlashMLA swapped for a torch stand-in), tiny shapes, in one run.

Eager, per mode (decode, MTP target verify, EAGLE draft steps): the CPU time (one torch thread) of one
step through every layer (init_forward_metadata + each layer's forward), minus the time spent inside
the kernel stand-ins (FlashMLA's get_mla_metadata / flash_mla_with_kvcache / flash_mla_sparse_fwd,
SGLang's Triton quantize_k_cache and seqlens_expand, its JIT fused metadata copy (stood in by its own
fallback copies), our Triton decode: on a GPU each is one launch and its device time is not host time),
divided by the layers. Each stand-in call is counted as one launch. Draft steps: SGLang's DeepseekSparseAttnMultiStepBackend on the draft runner (one MTP layer),
built with SGLang's DSA class replaced by ESS's as the product installs it; one draft round is the
container's init_forward_metadata then each step's forward_decode, divided by steps x draft layers.
On this CPU the store's own device work (the resolver, numba here, Triton on a GPU; FlashTrans copies,
LRU updates; the inline engine runs each fetch in the calling thread) runs as CPU code, counted as host
time: at tiny shapes a CPU op costs about what a launch's dispatch costs, so the ESS numbers are an
upper bound of the host cost on a GPU, not a GPU measurement. The store's CPU-only checks (validate,
on when the runner's device is the CPU) are off, as on CUDA.

Graph replays (--ess-cuda-graph, ESS's stream engine on tests/graph_double.py's CaptureStreams), per mode:
decode (a decode step of every layer), MTP verify (a TARGET_VERIFY step of every layer through the backend's
forward_extend, NDRAFT tokens per request) and EAGLE draft (every draft step's forward_decode over the draft
layer in one graph, through the multi-step container's hooks: ESS's container with ESS on, SGLang's with ESS
off), each captured once with the graph double through SGLang's hooks, then replayed with new requests (verify
and draft: accept lengths 1..NDRAFT, as eager). What Python runs per replay on a real GPU is the pre-replay
hook, init_forward_metadata_out_graph of the target backend or of the draft container (SGLang's replay
metadata, and with ESS on ESS's hook: replay_rows, the side streams' join, pools/graph_steps.py's counts); that
is timed, per step and per layer (per step / the layer-steps in the graph: target layers, or draft steps x 1
draft layer). The double's replay itself is not timed: it re-dispatches every recorded ATen op from Python,
where a CUDA graph replay is one launch and runs no Python per layer; its recorded op count (device ops in the
graph, a kernel stand-in's call as one) is reported instead. Stream and event calls of the CaptureStreams double
stand in for CUDA API calls. SGLang's own replay work (load_batch, the graph launch) is the same for both sides
and not timed. Each side records the classes that ran (hooks, attention_backends).
Results: bench/results/host_cpu.json with the command, commit and versions (bench/meta.py).
"""
from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

import torch

NDRAFT = 4
DRAFT_STEPS = NDRAFT - 2          # speculative_num_steps NDRAFT - 1: SGLang's container builds one backend fewer
EAGER_MODES = ("decode", "verify", "draft")
REPLAY_MODES = EAGER_MODES
# CPU time of this process, not wall time: the machine's cores are shared, and preemption is not host
# cost; torch runs single-threaded here (main) so CPU time is the one thread's
_clock = time.process_time


class _Timed:
    """Wraps a kernel stand-in: counts its calls (launches) and the seconds spent inside it."""

    def __init__(self, fn, tally):
        self.fn, self.tally = fn, tally

    def __call__(self, *a, **k):
        t = _clock()
        ops = self.tally.get("ops")                   # a graph capture's op list (run_replay), else None
        n = len(ops) if ops is not None else 0
        try:
            return self.fn(*a, **k)
        finally:
            self.tally["launches"] += 1
            self.tally["kernel_s"] += _clock() - t
            if ops is not None:
                self.tally["stand_in_ops"] += sum(1 for op in ops[n:] if op[4] != "view")


def _setup(mp, tally, decode_impl: str, spec: bool = True, **cfg):
    from sgl_ess.config import ENV_CONFIG_JSON, EssConfig
    from sgl_ess.kernels import sparse_mla_triton
    from tests.integration._cuda_fake import install_gpu_fakes

    mp.setenv(ENV_CONFIG_JSON, EssConfig(hot_slots_per_request=48, prefetch_engine="inline",
                                         warmup_queries=4, **cfg).to_json())
    prefill = "flashmla_auto" if decode_impl == "flashmla_kv" else "flashmla_sparse"   # SGLang's pick for FP8
    eagle = dict(speculative_algorithm="EAGLE", speculative_num_draft_tokens=NDRAFT, speculative_eagle_topk=1,
                 speculative_num_steps=NDRAFT - 1) if spec else {}
    stub, ov = install_gpu_fakes(mp, decode_impl=decode_impl, prefill_impl=prefill, **eagle)
    from sglang.srt.layers.attention import dsa_backend as mod

    for name in ("flash_mla_with_kvcache", "flash_mla_sparse_fwd", "get_mla_metadata"):
        setattr(stub, name, _Timed(getattr(stub, name), tally))
    for name in ("quantize_k_cache", "seqlens_expand_triton"):     # SGLang's Triton kernels (torch in the fake)
        mp.setattr(mod, name, _Timed(getattr(mod, name), tally))
    mp.setattr(sparse_mla_triton, "sparse_mla_decode_triton", _Timed(sparse_mla_triton.sparse_mla_decode_triton,
                                                                      tally))
    _fused_metadata_copy_stand_in(mp, tally)
    return ov


def _fused_metadata_copy_stand_in(mp, tally) -> None:
    """SGLang's fused metadata copy (a JIT CUDA kernel, one launch per draft step backend in the draft
    container's replay hook; its JIT needs nvcc and an sm, so here it would try to compile on every call and
    fall back): stood in by SGLang's own fallback copies (its ROCm branch), timed and counted as one launch."""
    from sglang.srt.layers.attention.dsa import dsa_metadata_manager as mm

    orig = mm.DSAMetadataManagementMixin._copy_base_replay_buffers

    def fallback(self, *a):
        hip = mm._is_hip
        mm._is_hip = True                    # SGLang's branch without the fused kernel: its individual copies
        try:
            return orig(self, *a)
        finally:
            mm._is_hip = hip
    timed = _Timed(fallback, tally)
    mp.setattr(mm.DSAMetadataManagementMixin, "_copy_base_replay_buffers", lambda self, *a: timed(self, *a))


def _summary(host, launches, meta_s, per_layer_key="host_us_per_layer"):
    host, meta_s = sorted(host), sorted(meta_s)
    return {"init_forward_metadata_us_per_step_median": 1e6 * meta_s[len(meta_s) // 2],
            f"{per_layer_key}_median": 1e6 * host[len(host) // 2], f"{per_layer_key}_min": 1e6 * host[0],
            "launches_per_layer": sum(launches) / len(launches), "steps": len(host)}


def _measure(backend, runner, rows, prompts, layers, reps, mode, tally, gen):
    from tests.integration import _fake_runner as fr
    from tests.integration._cuda_fake import cuda_batch, cuda_layer

    r2t = runner.req_to_token_pool.req_to_token
    seq = list(prompts)
    host, launches, meta_s = [], [], []
    for it in range(reps + 2):                       # 2 warm-up steps
        if mode == "decode":
            seq = [s + 1 for s in seq]
            loc = torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long()
            fb = cuda_batch("DECODE", rows, seq, loc)
            qpos = [s - 1 for s in seq]
        else:
            loc = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, seq)]).long()
            fb = cuda_batch("TARGET_VERIFY", rows, seq, loc)
            fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
            qpos = [c + j for c in seq for j in range(NDRAFT)]
        qs = [(fr.query(gen, len(qpos)), fr.causal_topk(gen, qpos)) for _ in range(layers)]
        tally.update(launches=0, kernel_s=0.0)
        t = _clock()
        backend.init_forward_metadata(fb)
        t_md = _clock() - t
        for li, (q, topk) in enumerate(qs):
            if mode == "decode":
                backend.forward_decode(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
            else:
                backend.forward_extend(q, None, None, cuda_layer(li), fb, save_kv_cache=False, topk_indices=topk)
        wall = _clock() - t
        if mode != "decode":
            seq = [c + 1 + (it % NDRAFT) for c in seq]    # accept 1..NDRAFT tokens
        if it >= 2:
            host.append((wall - tally["kernel_s"]) / layers)
            launches.append(tally["launches"] / layers)
            meta_s.append(t_md)
    return _summary(host, launches, meta_s)


def _measure_draft(container, draft, rows, prompts, reps, tally, gen):
    """EAGLE draft rounds (topk 1) as eagle_worker_v2.draft_forward runs them: the multi-step container's
    init_forward_metadata once, then step i's backend over the draft layer with out_cache_loc of step i
    (a draft step writes its row at committed + i and reads committed rows)."""
    from tests.integration import _fake_runner as fr
    from tests.integration._cuda_fake import cuda_batch, cuda_layer

    r2t = draft.req_to_token_pool.req_to_token
    committed = list(prompts)
    steps = container.attn_backends
    host, launches, meta_s = [], [], []
    for it in range(reps + 2):
        locs = [torch.stack([r2t[r, c + i] for r, c in zip(rows, committed)]).long() for i in range(len(steps))]
        fb = cuda_batch("DECODE", rows, committed, locs[0])
        fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
        qs = [(fr.query(gen, len(rows)), fr.causal_topk(gen, [c - 1 for c in committed])) for _ in steps]
        tally.update(launches=0, kernel_s=0.0)
        t = _clock()
        container.init_forward_metadata(fb)
        t_md = _clock() - t
        for step, loc, (q, topk) in zip(steps, locs, qs):
            fb.out_cache_loc = loc
            step.forward_decode(q, None, None, cuda_layer(0), fb, save_kv_cache=False, topk_indices=topk)
        wall = _clock() - t
        committed = [c + 1 + (it % NDRAFT) for c in committed]
        if it >= 2:
            host.append((wall - tally["kernel_s"]) / len(steps))      # the draft runner has 1 layer
            launches.append(tally["launches"] / len(steps))
            meta_s.append(t_md)
    return _summary(host, launches, meta_s)


def _prefill(backend, runner, rows, prompts, layers, gen, chunk: int = 16):
    """The last `chunk` tokens of each prompt as one extend batch: opens and warms the hot buffers."""
    from tests.integration import _fake_runner as fr
    from tests.integration._cuda_fake import cuda_batch, cuda_layer

    r2t = runner.req_to_token_pool.req_to_token
    fb = cuda_batch("EXTEND", rows, prompts, torch.cat([r2t[r, p - chunk:p] for r, p in zip(rows, prompts)]),
                    extend_lens=[chunk] * len(rows), prefix_lens=[p - chunk for p in prompts])
    backend.init_forward_metadata(fb)
    qpos = [p - chunk + j for p in prompts for j in range(chunk)]
    for li in range(layers):
        backend.forward_extend(fr.query(gen, len(qpos)), None, None, cuda_layer(li), fb, save_kv_cache=False,
                               topk_indices=fr.causal_topk(gen, qpos))


def _runner(req_pool, alloc, layers, rows, span, gen, decode_impl, draft=False):
    from tests.integration import _fake_runner as fr
    from tests.integration._cuda_fake import cuda_layer, cuda_runner

    runner = cuda_runner(req_pool, alloc, layers, fp8_pool=decode_impl == "flashmla_kv")
    runner.is_draft_worker = draft
    pool = runner.token_to_kv_pool
    for li in range(layers):
        for r, n in zip(rows, span):
            x = torch.randn(n, fr.KV_DIM, generator=gen)
            pool.set_mla_kv_buffer(cuda_layer(li), req_pool.req_to_token[r, :n],
                                   x[:, :fr.KV_LORA].to(torch.bfloat16), x[:, fr.KV_LORA:].to(torch.bfloat16))
    return runner


class _Adapters:
    """The process-wide adapter registry, restored (and new adapters shut down) on exit."""

    def __enter__(self):
        from sgl_ess.integration.sglang.pools import lifecycle
        self.lc, self.before = lifecycle, list(lifecycle._adapters)
        return self

    def __exit__(self, *exc):
        for a in self.lc._adapters:
            if a not in self.before:
                a.shutdown()
        self.lc._adapters[:] = self.before


def run(layers: int, batch: int, reps: int, decode_impl: str) -> dict:
    """Eager: decode, verify and draft steps, ESS off and on."""
    from _pytest.monkeypatch import MonkeyPatch
    from sglang.srt.layers.attention import dsa_backend as mod
    from sglang.srt.runtime_context import get_parallel

    from sgl_ess.integration.sglang.backends.cuda_backend import backend_class
    from tests.integration import _fake_runner as fr

    mp = MonkeyPatch()
    tally = {"launches": 0, "kernel_s": 0.0}
    ov = _setup(mp, tally, decode_impl)
    out = {}
    sglang_cls = mod.DeepseekSparseAttnBackend
    try:
        with _Adapters(), get_parallel().override(attn_dcp_rank=0):
            rows = list(range(1, batch + 1))
            prompts = [120 + 10 * i for i in range(batch)]
            span = [p + (reps + 4) * (NDRAFT + 1) for p in prompts]
            for side in ("ess_off", "ess_on"):
                cls = sglang_cls if side == "ess_off" else backend_class()
                req_pool, alloc = fr.shared_pools(max_requests=batch + 2, max_context=max(span) + 8)
                fr.place_requests(req_pool, rows, span)
                gen = torch.Generator().manual_seed(0)
                runner = _runner(req_pool, alloc, layers, rows, span, gen, decode_impl)
                draft = _runner(req_pool, alloc, 1, rows, span, gen, decode_impl, draft=True)
                backend = cls(runner)
                mp.setattr(mod, "DeepseekSparseAttnBackend", cls)     # as HookRegistry's REPLACE does with ESS on
                container = mod.DeepseekSparseAttnMultiStepBackend(draft, topk=1, speculative_num_steps=NDRAFT - 1)
                mp.setattr(mod, "DeepseekSparseAttnBackend", sglang_cls)
                assert len(container.attn_backends) == DRAFT_STEPS
                assert all((getattr(b, "ess", None) is not None) == (side == "ess_on") for b in container.attn_backends)
                if side == "ess_on":
                    for b in (backend, *container.attn_backends):
                        b.ess.validate = False   # as on CUDA (pool_adapter validates only on a cpu runner)
                    _prefill(backend, runner, rows, prompts, layers, gen)
                    draft_extend = cls(draft, skip_prefill=False)      # the draft's prefill / extend backend
                    _prefill(draft_extend, draft, rows, prompts, 1, gen)
                out[side] = {m: _measure(backend, runner, rows, prompts, layers, reps, m, tally, gen)
                             for m in ("decode", "verify")}
                out[side]["draft"] = _measure_draft(container, draft, rows, prompts, reps, tally, gen)
                for m in EAGER_MODES:                          # the classes that ran
                    out[side][m]["backend"] = _class_name(container.attn_backends[0] if m == "draft" else backend)
    finally:
        ov.restore()
        mp.undo()
    out["ratio_eager_ess_over_sglang"] = {
        m: out["ess_on"][m]["host_us_per_layer_median"] / out["ess_off"][m]["host_us_per_layer_median"]
        for m in EAGER_MODES}
    return out


class _CapturedStep:
    """SGLang's decode graph runner reduced to what the attention backend sees (as in
    tests/integration/test_cuda_graph_gpu_fake.py): static buffers of `bs` rows, one step of every layer
    (with ESS, the indexer's hand-off, then attention) captured once, replayed with new contents."""

    mode = "decode"

    def __init__(self, backend, runner, layers, bs):
        from tests.integration import _fake_runner as fr
        from tests.integration._cuda_fake import cuda_batch

        self.backend, self.runner, self.layers, self.bs = backend, runner, layers, bs
        self.hooks = backend                       # whose graph hooks SGLang's runner calls
        self.layer_steps = layers                  # layer-steps per replay
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int64)
        self.seq_lens = torch.ones(bs, dtype=torch.int64)
        self.out_cache_loc = torch.zeros(bs, dtype=torch.int64)
        self.q = [torch.zeros(bs, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in range(layers)]
        self.topk = [torch.full((bs, fr.TOPK), -1, dtype=torch.int32) for _ in range(layers)]
        fb = cuda_batch("DECODE", [0] * bs, [1] * bs, torch.zeros(bs, dtype=torch.int64))
        fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc = self.req_pool_indices, self.seq_lens, self.out_cache_loc
        fb.seq_lens_cpu = self.seq_lens
        self.fb = fb

    def forward(self):
        from sgl_ess.integration.sglang.backends.cuda_backend import _around_indexer_forward_cuda
        from tests.integration._cuda_fake import cuda_layer

        outs = []
        for li in range(self.layers):
            topk = self.topk[li]
            if getattr(self.backend, "ess", None) is not None:
                topk = _around_indexer_forward_cuda(lambda *a, _t=topk: _t, None, None, None, None, self.fb, li)
            outs.append(self.backend.forward_decode(self.q[li], None, None, cuda_layer(li), self.fb,
                                                    save_kv_cache=False, topk_indices=topk))
        return outs

    def warm_up(self) -> None:
        """SGLang's graph state and capture metadata, then its two warm-up runs (the capture comes next)."""
        b = self.hooks
        b.init_cuda_graph_state(self.bs, self.bs)
        b.init_forward_metadata_out_graph(self.fb, in_capture=True)
        for _ in range(2):
            self.forward()
            b.on_after_cuda_graph_warmup()

    @staticmethod
    def advance(seq, it):
        return [s + 1 for s in seq]

    def load(self, rows, seq, gen):
        """SGLang's load_batch (not timed: the same for both sides) for requests holding `seq` tokens, each
        decoding its next one; returns the replay's batch view."""
        from tests.integration import _fake_runner as fr

        n, r2t = len(rows), self.runner.req_to_token_pool.req_to_token
        seq = [s + 1 for s in seq]
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.seq_lens.fill_(1)
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(seq)
        self.out_cache_loc[:n] = torch.stack([r2t[r, s - 1] for r, s in zip(rows, seq)]).long()
        for li in range(self.layers):
            self.q[li].copy_(fr.query(gen, self.bs))
            self.topk[li].fill_(-1)
            self.topk[li][:n] = fr.causal_topk(gen, [s - 1 for s in seq])
        return SimpleNamespace(batch_size=self.bs, num_padding=self.bs - n, forward_mode=self.fb.forward_mode,
                               actual_forward_mode=self.fb.forward_mode, req_pool_indices=self.req_pool_indices,
                               seq_lens=self.seq_lens, seq_lens_cpu=self.seq_lens, out_cache_loc=self.out_cache_loc,
                               spec_info=None, seq_lens_sum=int(self.seq_lens.sum()))


class _CapturedVerify(_CapturedStep):
    """SGLang's graph runner in capture mode TARGET_VERIFY (as tests/integration/test_cuda_graph_verify_gpu_fake.py):
    static buffers of `bs` requests x NDRAFT tokens, one verify step of every layer (the backend's forward_extend,
    as SGLang's model runs it) captured once, replayed with new requests and accept lengths."""

    mode = "verify"

    def __init__(self, backend, runner, layers, bs):
        from tests.integration import _fake_runner as fr
        from tests.integration._cuda_fake import cuda_batch

        self.backend, self.runner, self.layers, self.bs = backend, runner, layers, bs
        self.hooks, self.layer_steps = backend, layers
        t = bs * NDRAFT
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int64)
        self.seq_lens = torch.ones(bs, dtype=torch.int64)
        self.out_cache_loc = torch.zeros(t, dtype=torch.int64)
        self.q = [torch.zeros(t, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in range(layers)]
        self.topk = [torch.full((t, fr.TOPK), -1, dtype=torch.int32) for _ in range(layers)]
        fb = cuda_batch("TARGET_VERIFY", [0] * bs, [1] * bs, torch.zeros(t, dtype=torch.int64))
        fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
        fb.req_pool_indices, fb.seq_lens, fb.out_cache_loc = self.req_pool_indices, self.seq_lens, self.out_cache_loc
        fb.seq_lens_cpu = self.seq_lens
        self.fb = fb

    def forward(self):
        from tests.integration._cuda_fake import cuda_layer

        return [self.backend.forward_extend(self.q[li], None, None, cuda_layer(li), self.fb, save_kv_cache=False,
                                            topk_indices=self.topk[li]) for li in range(self.layers)]

    def warm_up(self) -> None:
        b = self.hooks
        b.init_cuda_graph_state(self.bs, self.bs * NDRAFT)
        b.init_forward_metadata_out_graph(self.fb, in_capture=True)
        for _ in range(2):
            self.forward()
            b.on_after_cuda_graph_warmup()

    @staticmethod
    def advance(seq, it):
        return [c + 1 + (it % NDRAFT) for c in seq]     # accept 1..NDRAFT tokens, as the eager verify

    def load(self, rows, committed, gen):
        """SGLang's load_batch for requests with `committed` tokens verifying NDRAFT drafts each; the padding
        tokens' queries and top-k hold junk (SGLang's indexer runs over them too)."""
        from tests.integration import _fake_runner as fr

        n, t, r2t = len(rows), len(rows) * NDRAFT, self.runner.req_to_token_pool.req_to_token
        self.req_pool_indices.zero_()
        self.out_cache_loc.zero_()
        self.seq_lens.fill_(1)
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(committed)
        self.out_cache_loc[:t] = torch.cat([r2t[r, c:c + NDRAFT] for r, c in zip(rows, committed)]).long()
        qpos = [c + j for c in committed for j in range(NDRAFT)]
        for li in range(self.layers):
            self.q[li].copy_(fr.query(gen, self.bs * NDRAFT))
            self.topk[li].copy_(torch.randint(0, 40, self.topk[li].shape, generator=gen, dtype=torch.int32))
            self.topk[li][:t] = fr.causal_topk(gen, qpos)
        return SimpleNamespace(batch_size=self.bs, num_padding=self.bs - n, forward_mode=self.fb.forward_mode,
                               actual_forward_mode=self.fb.forward_mode, req_pool_indices=self.req_pool_indices,
                               seq_lens=self.seq_lens, seq_lens_cpu=self.seq_lens, out_cache_loc=self.out_cache_loc,
                               spec_info=self.fb.spec_info, seq_lens_sum=int(self.seq_lens.sum()))


class _CapturedDraft(_CapturedStep):
    """SGLang's draft graph runner (as tests/integration/test_cuda_graph_draft_gpu_fake.py): the multi-step
    container's graph hooks, every draft step's forward_decode over the draft layer captured in one graph, the
    batch's out_cache_loc swapped per step as SGLang's draft_forward does."""

    mode = "draft"

    def __init__(self, container, runner, bs):
        from tests.integration import _fake_runner as fr
        from tests.integration._cuda_fake import cuda_batch

        self.backend, self.runner, self.layers, self.bs = container.attn_backends[0], runner, 1, bs
        self.hooks, self.steps = container, container.attn_backends
        self.layer_steps = len(self.steps)                            # one draft layer per step
        self.req_pool_indices = torch.zeros(bs, dtype=torch.int64)
        self.seq_lens = torch.ones(bs, dtype=torch.int64)
        self.locs = torch.zeros(len(self.steps), bs, dtype=torch.int64)
        self.q = [torch.zeros(bs, fr.HEADS * fr.KV_DIM, dtype=fr.DTYPE) for _ in self.steps]
        self.topk = [torch.full((bs, fr.TOPK), -1, dtype=torch.int32) for _ in self.steps]
        fb = cuda_batch("DECODE", [0] * bs, [1] * bs, torch.zeros(bs, dtype=torch.int64))
        fb.spec_info = SimpleNamespace(draft_token_num=NDRAFT)
        fb.req_pool_indices, fb.seq_lens, fb.seq_lens_cpu = self.req_pool_indices, self.seq_lens, self.seq_lens
        fb.out_cache_loc = self.locs.reshape(-1)                      # SGLang's: every step's locations
        self.fb = fb

    def forward(self):
        from tests.integration._cuda_fake import cuda_layer

        self.hooks.init_forward_metadata_in_graph(self.fb)           # SGLang's run_once calls it in the capture
        outs = []
        for i, s in enumerate(self.steps):
            self.fb.out_cache_loc = self.locs[i]
            outs.append(s.forward_decode(self.q[i], None, None, cuda_layer(0), self.fb, save_kv_cache=False,
                                         topk_indices=self.topk[i]))
        self.fb.out_cache_loc = self.locs.reshape(-1)
        return outs

    def warm_up(self) -> None:
        ms = self.hooks
        ms.init_cuda_graph_state(self.bs, self.bs)
        ms.init_forward_metadata_out_graph(self.fb, in_capture=True)
        warmup = getattr(ms, "on_after_cuda_graph_warmup", None)     # SGLang's container has none
        for _ in range(2):
            self.forward()
            if warmup is not None:
                warmup()

    advance = staticmethod(_CapturedVerify.advance)

    def load(self, rows, committed, gen):
        """SGLang's replay load: step i writes its row at committed + i and reads committed rows."""
        from tests.integration import _fake_runner as fr

        n, r2t = len(rows), self.runner.req_to_token_pool.req_to_token
        self.req_pool_indices.zero_()
        self.seq_lens.fill_(1)
        self.locs.zero_()
        self.req_pool_indices[:n] = torch.tensor(rows)
        self.seq_lens[:n] = torch.tensor(committed)
        for i in range(len(self.steps)):
            self.locs[i, :n] = torch.stack([r2t[r, c + i] for r, c in zip(rows, committed)]).long()
            self.q[i].copy_(fr.query(gen, self.bs))
            self.topk[i].copy_(torch.randint(0, 40, self.topk[i].shape, generator=gen, dtype=torch.int32))
            self.topk[i][:n] = fr.causal_topk(gen, [c - 1 for c in committed])
        view = SimpleNamespace(**vars(self.fb), num_padding=self.bs - n)
        view.seq_lens_sum = int(self.seq_lens.sum())
        return view


def _class_name(obj) -> str:
    return f"{type(obj).__module__}.{type(obj).__qualname__}"


def _replay_side(step, rt, rows, prompts, reps, tally, gen) -> dict:
    """Warm-up, capture, then reps + 2 replays (2 warm-up): the pre-replay hook timed, the graph's ops counted."""
    from tests.graph_double import Graph

    graph = Graph(rt)
    step.warm_up()
    tally.update(launches=0, ops=graph.ops, stand_in_ops=0)
    graph.capture(step.forward)
    tally.pop("ops")
    cap_launches = tally["launches"]
    # the stand-ins' torch ops are one kernel each on a GPU
    device_ops = sum(1 for op in graph.ops if op[4] != "view") - tally["stand_in_ops"] + cap_launches
    seq, host, launches = list(prompts), [], []
    for it in range(reps + 2):
        view = step.load(rows, seq, gen)
        tally.update(launches=0, kernel_s=0.0)
        t = _clock()
        step.hooks.init_forward_metadata_out_graph(view)     # the Python that runs per replay
        pre = _clock() - t - tally["kernel_s"]
        graph.replay()
        if rt is not None:
            rt.progress(3)
        seq = step.advance(seq, it)
        if it >= 2:
            host.append(pre)
            launches.append(tally["launches"])
    host.sort()
    n = step.layer_steps
    return {"pre_replay_us_per_step_median": 1e6 * host[len(host) // 2],
            "pre_replay_us_per_step_min": 1e6 * host[0],
            "pre_replay_us_per_layer_median": 1e6 * host[len(host) // 2] / n,
            "pre_replay_launches_per_step": sum(launches) / len(launches),
            "python_per_layer_in_replay": 0, "layer_steps_per_replay": n,
            "graph_device_ops_per_layer": device_ops / n, "graph_stand_in_launches_per_layer": cap_launches / n,
            "replays": len(host), "hooks": _class_name(step.hooks),
            "attention_backends": sorted({_class_name(b) for b in getattr(step, "steps", [step.backend])})}


def _ess_on_streams(backend):
    """ESS's stream engine on the CaptureStreams double (the resolver and FlashTrans as torch), as on CUDA."""
    from sgl_ess.prefetch.stream_engine import StreamEngine
    from tests.graph_double import CaptureStreams

    store, rt = backend.ess.store, CaptureStreams(seed=3)
    store.engine = StreamEngine(store.memory, "torch", device="cpu", runtime=rt, zero_backend="torch")
    store.resolver_backend = "torch"
    backend.ess.validate = False            # as on CUDA (validated only on a cpu runner)
    return rt


def run_replay(layers: int, batch: int, reps: int, decode_impl: str, mode: str = "decode") -> dict:
    """Graph replays of one mode (decode, verify, draft), ESS off and on: the pre-replay hook's host time,
    and the graph's op count."""
    from _pytest.monkeypatch import MonkeyPatch
    from sglang.srt.layers.attention import dsa_backend as mod
    from sglang.srt.model_executor import forward_context
    from sglang.srt.runtime_context import get_parallel

    from sgl_ess.integration.sglang.backends.cuda_backend import backend_class
    from sgl_ess.integration.sglang.backends.cuda_multistep import multistep_class
    from sgl_ess.kernels import flashtrans
    from tests.integration import _fake_runner as fr
    from tests.integration._cuda_fake import copy_rows_static

    mp = MonkeyPatch()
    tally = {"launches": 0, "kernel_s": 0.0}
    ov = _setup(mp, tally, decode_impl, spec=mode != "decode", cuda_graph=True)
    mp.setattr(flashtrans, "copy_rows_torch", copy_rows_static)    # FlashTrans with static shapes, as on CUDA
    current = {}
    mp.setattr(forward_context, "get_attn_backend", lambda: current["backend"])
    mp.setattr(forward_context, "get_req_to_token_pool", lambda: current["backend"].req_to_token_pool)
    sglang_cls, sglang_ms = mod.DeepseekSparseAttnBackend, mod.DeepseekSparseAttnMultiStepBackend
    out = {}
    try:
        with _Adapters(), get_parallel().override(attn_dcp_rank=0):
            rows = list(range(1, batch + 1))
            prompts = [120 + 10 * i for i in range(batch)]
            span = [p + (reps + 4) * (NDRAFT + 1) for p in prompts]
            for side in ("ess_off", "ess_on"):
                cls = sglang_cls if side == "ess_off" else backend_class()
                req_pool, alloc = fr.shared_pools(max_requests=batch + 2, max_context=max(span) + 8)
                fr.place_requests(req_pool, rows, span)
                gen = torch.Generator().manual_seed(0)
                runner = _runner(req_pool, alloc, 1 if mode == "draft" else layers, rows, span, gen, decode_impl,
                                 draft=mode == "draft")
                rt, ess = None, None
                if mode == "draft":
                    mp.setattr(mod, "DeepseekSparseAttnBackend", cls)   # as HookRegistry's REPLACE does with ESS on
                    ms_cls = sglang_ms if side == "ess_off" else multistep_class()
                    container = ms_cls(runner, topk=1, speculative_num_steps=NDRAFT - 1)
                    mp.setattr(mod, "DeepseekSparseAttnBackend", sglang_cls)
                    assert len(container.attn_backends) == DRAFT_STEPS
                    assert all(type(b) is cls for b in container.attn_backends)
                    step = _CapturedDraft(container, runner, batch)
                    if side == "ess_on":
                        prefill = cls(runner, skip_prefill=False)     # the draft's extend backend, same store
                        ess = prefill.ess
                        rt = _ess_on_streams(prefill)
                        for b in container.attn_backends:
                            b.ess.validate = False
                        _prefill(prefill, runner, rows, prompts, 1, gen)
                else:
                    backend = cls(runner)
                    step = (_CapturedStep if mode == "decode" else _CapturedVerify)(backend, runner, layers, batch)
                    if side == "ess_on":
                        ess = backend.ess
                        rt = _ess_on_streams(backend)
                        _prefill(backend, runner, rows, prompts, layers, gen)
                current["backend"] = step.backend
                out[side] = _replay_side(step, rt, rows, prompts, reps, tally, gen)
                if ess is not None:
                    u = ess.path_usage()
                    assert u["graph_captures"] == 1 and u["graph_replays"] == reps + 2, u
                    out[side]["ess_graph_replays"] = u["graph_replays"]
    finally:
        ov.restore()
        mp.undo()
    out["ratio_pre_replay_ess_over_sglang"] = (out["ess_on"]["pre_replay_us_per_step_median"]
                                               / out["ess_off"]["pre_replay_us_per_step_median"])
    return out


REPLAY_WHAT = (
    "pre-replay hook (init_forward_metadata_out_graph of the target backend, or of the draft's multi-step container: "
    "SGLang's replay metadata, plus ESS's hook with ESS on) timed per replay, as it runs eagerly on a GPU; per layer "
    "= per step / layer-steps in the graph (target layers; draft steps x 1 draft layer); the double's replay of the "
    "recorded ops is not timed (it re-dispatches each ATen op from Python; a CUDA graph replay is one launch, "
    "0 Python per layer): graph_device_ops_per_layer counts the ops it holds (recorded ATen ops that are not "
    "views, each FlashMLA / SGLang Triton stand-in call counted as one op; ESS's resolver and FlashTrans copy run "
    "as their torch references, so ESS's count is an upper bound of its launches)")


def bench(layers: int, batch: int, reps: int, decode_impl: str) -> dict:
    """The whole result (without meta): eager modes and the replays, in one run."""
    replay = {m: run_replay(layers, batch, reps, decode_impl, m) for m in REPLAY_MODES}
    replay["what"] = REPLAY_WHAT
    return {"suite": "host", "device": "cpu (GPU fake)", "clock": "time.process_time, torch 1 thread",
            "decode_impl": decode_impl, "layers": layers, "batch": batch, "draft_tokens": NDRAFT,
            "draft_steps": DRAFT_STEPS, "draft_layers": 1, "eager": run(layers, batch, reps, decode_impl),
            "replay": replay, "goal": "eager ESS <= 1.2 x SGLang host time per layer; a replay 0 Python per layer"}


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench host", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--decode-impl", default="flashmla_kv", choices=["flashmla_kv", "flashmla_sparse"])
    a = ap.parse_args()
    from bench.meta import write_result

    torch.set_num_threads(1)
    payload = bench(a.layers, a.batch, a.reps, a.decode_impl)
    path = write_result("host_cpu", payload)
    res = payload["eager"]
    for m, r in res["ratio_eager_ess_over_sglang"].items():
        print(f"eager  {m:7s} ESS off {res['ess_off'][m]['host_us_per_layer_median']:8.1f} us/layer "
              f"({res['ess_off'][m]['launches_per_layer']:.1f} launches)  ESS on "
              f"{res['ess_on'][m]['host_us_per_layer_median']:8.1f} us/layer "
              f"({res['ess_on'][m]['launches_per_layer']:.1f} launches)  ratio {r:.2f}")
    for m in REPLAY_MODES:
        rp = payload["replay"][m]
        off, on = rp["ess_off"], rp["ess_on"]
        print(f"replay {m:7s} ESS off {off['pre_replay_us_per_step_median']:8.1f} us/step "
              f"({off['pre_replay_us_per_layer_median']:.1f}/layer) pre-replay  ESS on "
              f"{on['pre_replay_us_per_step_median']:8.1f} us/step ({on['pre_replay_us_per_layer_median']:.1f}/layer)"
              f"  ratio {rp['ratio_pre_replay_ess_over_sglang']:.2f}  (graph device ops/layer "
              f"{off['graph_device_ops_per_layer']:.0f} vs {on['graph_device_ops_per_layer']:.0f}; "
              "0 Python per layer in a replay)")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
