"""Retraction frees ESS state: with SGLang's own test switch forcing `retract_decode` every few
steps, every request still completes and host-pool / hot-buffer usage returns to zero. Run on the
CPU ``ess`` backend and as a GPU fake through the CUDA class in an H200's default configuration
(test_gpu_fake_server.H200_ARGS: FP8 656-byte rows, flashmla_kv, SGLang's own prefill pick, on the
V3.2-latent tiny model; tests/gpu_fake_site: SGLang's DSA backend replaced by ESS's subclass, the
side-stream engine with late, out-of-order streams; only the device kernels and the stream runtime
swapped)."""
import concurrent.futures as cf
import re

import pytest

from .conftest import HOT_SLOTS, _start
from ._server import group_alive
from .test_gpu_fake_server import GPU_FAKE_H200_ENV, H200_ARGS
from .test_usage_release import _prompt

pytestmark = pytest.mark.integration


RETRACT_ENV = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "3"}
BACKENDS = {"cpu": ([], {}),
            "gpu_fake": (H200_ARGS, GPU_FAKE_H200_ENV)}    # an H200's default: FP8 rows, flashmla_kv


@pytest.fixture(scope="module", params=sorted(BACKENDS))
def server_retract(request):
    args, env = BACKENDS[request.param]
    srv = _start(f"ess_retract_{request.param}", ["--ess-hot-slots-per-request", str(HOT_SLOTS),
                                                  "--max-running-requests", "8", "--max-total-tokens", "16384"] + args,
                 env={**RETRACT_ENV, **env})
    srv.backend = request.param
    yield srv
    srv.stop()
    assert not group_alive(srv.pgid), f"processes of {srv.name} left behind (pgid {srv.pgid})"


def test_retracted_requests_complete_and_release_everything(server_retract):
    with cf.ThreadPoolExecutor(6) as ex:
        results = list(ex.map(lambda i: server_retract.generate(_prompt(300 + i), 24), range(6)))
    assert all(r["meta_info"]["completion_tokens"] == 24 for r in results)
    retracted = [int(n) for n in re.findall(r"Testing retraction\. #retracted_reqs: (\d+)",
                                             server_retract.log_tail(100000))]
    assert sum(retracted) > 0, "SGLang did not retract any request; the test proves nothing"
    u = server_retract.wait_ess_zero()
    assert u["hot_requests_open"] == 0 and u["hot_slots_used"] == 0 and u["host_tokens_used"] == 0
    if server_retract.backend == "gpu_fake":
        assert u["prefetch"]["engine"] == "stream", u["prefetch"]      # the CUDA class's side-stream engine
