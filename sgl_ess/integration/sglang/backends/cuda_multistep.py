"""ESS's EAGLE draft decode container on CUDA: SGLang's ``DeepseekSparseAttnMultiStepBackend`` (one DSA
backend per draft step, here ESS's subclass, cuda_backend.py) with the graph hooks ESS needs when SGLang's
draft graph runner captures the whole multi-step draft forward in one CUDA graph (--ess-cuda-graph).
NOT YET RUN ON A GPU: checked on CPU with the graph double (tests/integration/test_cuda_graph_draft_gpu_fake.py).

SGLang's container alone does not reach ESS: at capture it hands each step backend a DECODE view
(``build_inner_fb_view``), not the batch the steps then run with, so a step could not tell the capture's
forwards from eager ones; before a replay it copies SGLang's metadata into each step through private
methods and calls none of the step's public hooks; and it has no ``on_after_cuda_graph_warmup``. This
subclass, after SGLang's own work in each hook:
  * capture (``init_forward_metadata_out_graph(in_capture=True)``): registers the batch the runner captures
    with (the one its draft forward runs every step with) with every step, so their forwards take
    cuda_graph.graph_draft; the store (one per draft runner, shared by the steps) starts the capture once;
  * after each warm-up: the store orders its eager work before the capture (``graph_capture``);
  * replay (``init_forward_metadata_out_graph`` with SGLang's replay view, ``num_padding`` set): the store's
    replay hook once (pending rows opened, eager work ordered before the graph, host counts of a replay).
Installed with HookRegistry class REPLACE on ``dsa_backend.DeepseekSparseAttnMultiStepBackend`` next to the
DSA backend class (cuda_backend.register); without ESS on a step it is SGLang's container unchanged.
"""

from __future__ import annotations

from .cuda_graph import replay_rows

_cls = None


def multistep_class():
    """The ESS subclass of SGLang's multi-step DSA draft backend (built once; imports SGLang's CUDA module)."""
    global _cls
    if _cls is not None:
        return _cls
    from sglang.srt.layers.attention import dsa_backend as mod

    base = mod.DeepseekSparseAttnMultiStepBackend

    class EssDeepseekSparseAttnMultiStepBackend(base):
        def __init__(self, model_runner, *args, **kwargs):
            super().__init__(model_runner, *args, **kwargs)
            steps = [b for b in self.attn_backends if getattr(b, "ess", None) is not None]
            self.ess = steps[0].ess if steps else None
            for b in steps:
                b.graph_container = True

        def init_forward_metadata_out_graph(self, forward_batch, in_capture=False):
            super().init_forward_metadata_out_graph(forward_batch, in_capture=in_capture)
            if self.ess is None:
                return
            if in_capture:
                self.ess.graph_capture_batch(int(forward_batch.batch_size))
                for b in self.attn_backends:
                    b._forward.graph_batches.add(forward_batch)
            else:
                size, n_real, rows = replay_rows(forward_batch, self.ess.has_pending())
                self.ess.graph_replay(rows, size, n_real)

        def on_after_cuda_graph_warmup(self):
            """After each of SGLang's warm-up runs of the draft forward (its capture comes after the last)."""
            hook = getattr(base, "on_after_cuda_graph_warmup", None)
            if hook is not None:
                hook(self)
            if self.ess is not None:
                self.ess.graph_capture()

    EssDeepseekSparseAttnMultiStepBackend.__qualname__ = "EssDeepseekSparseAttnMultiStepBackend"
    _cls = EssDeepseekSparseAttnMultiStepBackend
    return _cls
