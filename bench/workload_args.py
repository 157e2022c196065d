"""The decode-workload flags the store and kernel benchmarks share (the issue's shapes as defaults)."""
from __future__ import annotations

import argparse


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """--batch --k --slots --context --repeat --device --threads."""
    import torch

    p.add_argument("--batch", type=int, default=64, help="requests per step (default 64)")
    p.add_argument("--k", type=int, default=2048, help="top-k entries per request (default 2048)")
    p.add_argument("--slots", type=int, default=6400, help="hot-buffer slots N per request (default 6400)")
    p.add_argument("--context", type=int, default=32768, help="context tokens per request (default 32768)")
    p.add_argument("--repeat", type=float, default=0.85, help="fraction of top-k kept step to step")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=0,
                   help="torch CPU threads (default: torch's own); on a shared, loaded machine 1 avoids "
                        "OpenMP regions stalling on a descheduled second thread")


def apply_threads(args: argparse.Namespace) -> None:
    if args.threads > 0:
        import torch

        torch.set_num_threads(args.threads)
