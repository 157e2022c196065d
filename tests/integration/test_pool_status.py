"""Issue 7, defects 4 and 8: /ess/status reports what the server really uses, and tells live host
rows from evictable prefix-cache rows (a leak must be distinguishable from cache)."""

import pytest

from ._http import call, ids_prompt
from .conftest import OPS_HOST_POOL_GB, OPS_POOL_TOKENS

pytestmark = pytest.mark.integration


def test_host_pool_sized_by_gb_is_what_the_server_allocates(server_ops):
    status = server_ops.get("/ess/status")
    s = status["schedulers"][0]
    assert status["pool_sizing"]["source"].startswith("--ess-memory-pool-size-gb")
    assert s["host_tokens_capacity"] == OPS_POOL_TOKENS == status["pool_sizing"]["tokens"]
    assert s["host_bytes"] == status["pool_sizing"]["host_bytes_expected"]
    assert s["host_bytes"] <= OPS_HOST_POOL_GB * 1e9, "more host memory allocated than --ess-memory-pool-size-gb"
    assert s["memory_pool_size_gb_effective"] == s["host_bytes"] / 1e9


def test_cached_prefix_rows_are_not_counted_as_live(server_ops):
    for i in range(3):   # finished requests leave their rows in the radix cache
        st, text = call(server_ops.base, "/generate", {"input_ids": ids_prompt(600 + 64 * i),
                                                       "sampling_params": {"max_new_tokens": 4}})
        assert st == 200, text[:200]
    s = server_ops.ess_usage()
    assert s["bytes_d2h"] > 0, "rows SGLang wrote into the host pool are not counted (issue 16, defect 7)"
    assert s["host_tokens_cached"] > 0, s
    assert s["host_tokens_live"] == 0, f"live host rows with no request running: {s}"
    assert s["host_tokens_live"] + s["host_tokens_cached"] + s["host_tokens_free"] == s["host_tokens_capacity"]
    assert s["queue"] == {"waiting_requests": 0, "oldest_wait_s": 0.0, "running_requests": 0}


def test_sigusr2_writes_every_threads_stack_to_the_log_and_the_server_runs_on(server_ops):
    """Diagnostics for a server that hangs: `kill -USR2 <pid>` (the plugin's faulthandler) prints
    the Python stacks of that process's threads to its log and does not stop it."""
    from ._server import group_processes

    before = open(server_ops.log.name, errors="replace").read().count("Current thread")
    tail = server_ops.dump_stacks()
    dumped = open(server_ops.log.name, errors="replace").read().count("Current thread") - before
    assert dumped >= 2, f"expected the launcher's and the scheduler's stacks, got {dumped} dumps:\n{tail[-3000:]}"
    assert "scheduler" in tail.lower() and "event_loop" in tail, "the scheduler's stack is not in the log"
    assert len(group_processes(server_ops.pgid)) >= 3, "a process of the server ended on SIGUSR2"
    assert server_ops.generate("Hello", 4)["meta_info"]["completion_tokens"] == 4
