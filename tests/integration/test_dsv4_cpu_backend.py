"""dsv4/cpu_backend.py (the CPU arm of the dsv4 backend) against a per-request reference built from
sgl_ess/attention/dsv4_* with the incremental CompressorState (not the backend's vectorised
compress_prefix), on small fake layers: two requests at scattered pool locations, an extend from empty,
an extend on the cached prefix and two decode steps; a window layer (window 8), a C4 layer with its
indexer (top-3 of up to 37 entries) and a C128 layer (150 tokens: one finished entry). Checks the glue:
token -> request and location mapping, the sliding window, visibility of compressed entries, the
indexer's choice per token, the undoing of SGLang's C4 ape rearrangement. float32: rtol/atol 1e-5
(float32 rounding of the same sums in another order)."""

import types

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("sglang")

from sgl_ess.attention.dsv4_attention import layer_attention  # noqa: E402
from sgl_ess.attention.dsv4_compressor import CompressorState  # noqa: E402
from sgl_ess.attention.dsv4_indexer import index_scores, select_topk, visible_c4_entries  # noqa: E402
from sgl_ess.attention.dsv4_rope import apply_rope_tail, finish_entry  # noqa: E402
from sgl_ess.integration.sglang.dsv4.cpu_backend import DeepseekV4CpuAttnBackend  # noqa: E402
from sgl_ess.integration.sglang.dsv4.side_rows import SideRows  # noqa: E402

pytestmark = pytest.mark.integration
D, DI, ROPE, HIDDEN, HEADS, IHEADS, TOPK, WINDOW = 16, 8, 4, 12, 2, 2, 3, 8
G = torch.Generator().manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, generator=G)


def freqs(n=512):
    ang = torch.arange(n, dtype=torch.float32)[:, None] * (1.0 / 100 ** (torch.arange(0, ROPE, 2) / ROPE))[None]
    return torch.polar(torch.ones_like(ang), ang)


def compressor(ratio, d):
    coff = 2 if ratio == 4 else 1
    ape_ckpt = rnd(ratio, coff * d)
    stored = ape_ckpt
    if coff == 2:                      # SGLang's _apply_ape_hotfix: chunk, stack on dim 0, view back
        a = torch.chunk(ape_ckpt, 2, dim=-1)
        stored = torch.cat([a[0], a[1]], dim=0).reshape(ratio, -1)
    w = rnd(HIDDEN, 2 * coff * d) * 0.5
    return types.SimpleNamespace(
        ratio=ratio, head_dim=d, overlap=coff == 2, ape=types.SimpleNamespace(data=stored), ape_converted=True,
        ape_ckpt=ape_ckpt, wkv_gate=lambda x, w=w: (x @ w, None), rope_head_dim=ROPE, freqs_cis=freqs(),
        norm=types.SimpleNamespace(weight=types.SimpleNamespace(data=rnd(d).abs() + 0.5), variance_epsilon=1e-6))


def indexer(layer_id):
    wq, ww = rnd(HIDDEN, IHEADS * DI), rnd(HIDDEN, IHEADS)
    return types.SimpleNamespace(layer_id=layer_id, use_fp4_indexer=False, compressor=compressor(4, DI),
                                 wq_b=lambda q, wq=wq: (q @ wq, None), n_local_heads=IHEADS, head_dim=DI,
                                 freqs_cis=freqs(), rope_head_dim=ROPE, compute_weights=lambda x, ww=ww: x @ ww * 0.25)


def mode(decode):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.DECODE if decode else ForwardMode.EXTEND


class Reference:
    """Each request's tokens so far, and the reference output of its new tokens."""

    def __init__(self, layers):
        self.layers = layers
        self.x, self.swa = {}, {}                          # req -> its tokens' x; (req, layer) -> window rows

    def attend(self, req, xs, swas, qs, positions):
        self.x[req] = torch.cat([self.x.get(req, xs[:0]), xs])
        x_all = self.x[req]
        out = {}
        for lid, (ratio, comp, idx) in self.layers.items():
            compressed = chosen = None
            if ratio:
                state = CompressorState(ratio, comp.head_dim, comp.ape_ckpt)
                got = state.append(comp.wkv_gate(x_all)[0])
                if got:
                    compressed = torch.stack([finish_entry(e, n, ratio, comp.norm.weight.data, 1e-6, comp.freqs_cis,
                                                           ROPE) for n, e in got])
                if ratio == 4 and compressed is not None:
                    kstate = CompressorState(4, DI, idx.compressor.ape_ckpt)
                    keys = torch.stack([finish_entry(e, n, 4, idx.compressor.norm.weight.data, 1e-6, freqs(), ROPE)
                                        for n, e in kstate.append(idx.compressor.wkv_gate(x_all)[0])])
                    q = idx.wq_b(xs)[0].view(-1, IHEADS, DI)
                    q = apply_rope_tail(q, freqs()[positions][:, None, :], ROPE)
                    chosen = select_topk(index_scores(q, idx.compute_weights(xs), keys), visible_c4_entries(positions),
                                         TOPK)
                elif ratio == 128 and compressed is not None:
                    j = torch.arange(compressed.shape[0])
                    chosen = torch.where(j[None] < ((positions + 1) // 128)[:, None], j[None], -1)
            self.swa[req, lid] = torch.cat([self.swa.get((req, lid), swas[lid][:0]), swas[lid]])
            out[lid] = layer_attention(qs[lid], positions, self.swa[req, lid], SINK, 0.25, compressed, chosen, WINDOW)
        return out


SINK = torch.tensor([0.3, -0.7])


def make_backend(req_to_token, ess=None, fp8_rows=False):
    """The backend without a model runner; fp8_rows=False keeps the small test layers' rows unrounded (V4's
    FP8 row needs 512 channels)."""
    backend = DeepseekV4CpuAttnBackend.__new__(DeepseekV4CpuAttnBackend)
    backend.req_to_token, backend.fp8_rows = req_to_token, fp8_rows
    backend.window, backend.index_topk = WINDOW, TOPK
    backend.rows, backend.chosen, backend.compressors, backend.ess = SideRows(), {}, {}, ess
    return backend


def run_steps(layers, backends, steps, reqs, seq, on_outputs, d=D, inputs=None):
    """Feed the same random inputs to every backend (rows of d channels); on_outputs(got per backend, new,
    positions, x, swa, qs). `inputs(t)`: the step's (x, swa, qs) for t tokens instead of fresh random ones."""
    for new, decode in steps:
        positions = torch.cat([torch.arange(seq[r], seq[r] + new[r]) for r in reqs])
        out_loc = torch.cat([backends[0].req_to_token[r, seq[r]:seq[r] + new[r]] for r in reqs])
        for r in reqs:
            seq[r] += new[r]
        t = positions.numel()
        fb = types.SimpleNamespace(forward_mode=mode(decode), seq_lens=torch.tensor([seq[r] for r in reqs]),
                                   extend_seq_lens=torch.tensor([new[r] for r in reqs]), extend_seq_lens_cpu=None,
                                   req_pool_indices=torch.tensor(reqs), positions=positions, out_cache_loc=out_loc)
        if inputs is not None:
            x, swa, qs = inputs(t)
        else:
            x = rnd(t, HIDDEN)
            swa = {lid: rnd(t, d) for lid in layers}
            qs = {lid: rnd(t, HEADS, d) for lid in layers}
        on_outputs(forward_backends(backends, layers, fb, x, swa, qs, d), new, positions, x, swa, qs)


def forward_backends(backends, layers, fb, x, swa, qs, d=D):
    """One forward batch `fb` through every backend on the same inputs, each layer as the model calls its
    backend (store_cache, the C4 indexer, the compressor, attention); returns each backend's outputs by layer."""
    gots = []
    for backend in backends:
        backend.init_forward_metadata(fb)
        got = {}
        for lid, (ratio, comp, idx) in layers.items():
            backend.store_cache(lid, swa[lid], fb)
            if idx is not None:
                backend.forward_c4_indexer(x, x, fb, idx)
            if comp is not None:
                backend.forward_core_compressor(x, fb, lid, comp)
            layer = types.SimpleNamespace(layer_id=lid, scaling=0.25, v_head_dim=d)
            got[lid] = backend.forward(qs[lid], None, None, layer, fb, compress_ratio=ratio, attn_sink=SINK)
        gots.append(got)
    return gots


def test_cpu_backend_equals_per_request_reference():
    layers = {0: (0, None, None), 2: (4, compressor(4, D), indexer(2)), 3: (128, compressor(128, D), None)}
    perm = torch.randperm(600, generator=G)
    backend = make_backend(torch.stack([perm[:300], perm[300:]]))     # two request rows, scattered locations
    ref = Reference(layers)
    reqs = [0, 1]

    def check(gots, new, positions, x, swa, qs):
        got, start = gots[0], 0
        for r in reqs:
            rows = slice(start, start + new[r])
            start += new[r]
            want = ref.attend(r, x[rows], {lid: swa[lid][rows] for lid in layers},
                              {lid: qs[lid][rows] for lid in layers}, positions[rows])
            for lid in layers:
                assert torch.allclose(got[lid][rows], want[lid], rtol=1e-5, atol=1e-5), (lid, r)

    steps = [({0: 150, 1: 13}, False), ({0: 5, 1: 30}, False), ({0: 1, 1: 1}, True), ({0: 1, 1: 1}, True)]
    run_steps(layers, [backend], steps, reqs, {0: 0, 1: 0}, check)
