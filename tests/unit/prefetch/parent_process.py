"""A parent process that owns WorkerEngines (for test_lifecycle). Modes:
  kill   start engine A and run a plan through it, print {"worker_pid": A's worker}, wait for a line on
         stdin (the test has looked at the disk by then), then start engine B (blocks while B's worker
         imports torch): the test SIGKILLs us during that
  exit   start engine A, run a plan, print, then leave without close(): the interpreter-exit
         finalizer must stop the worker
"""
import json
import sys

import torch

from sgl_ess.prefetch.client import WorkerEngine
from sgl_ess.prefetch.plan import CopyPlan
from tests.unit.prefetch.helpers import make_memory

mode = sys.argv[1]
a = WorkerEngine(make_memory(seed=0))
a.wait(a.submit(CopyPlan("h2s", torch.arange(0, 8), torch.arange(0, 8))))
print(json.dumps({"worker_pid": a.stats()["worker_pid"]}), flush=True)
if mode == "kill":
    sys.stdin.readline()
    b = WorkerEngine(make_memory(seed=1), start_timeout_s=120)
    print("engine B started before the test killed us", file=sys.stderr, flush=True)
