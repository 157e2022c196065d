"""`--ess-prefetch-engine auto` on CPU counts the cores of this rank, not of the machine (issue 17)."""
import torch

from sgl_ess.store.engine_choice import WORKER_MIN_CPUS, auto_cpu_engine, rank_cpu_cores


def test_the_worker_needs_a_rank_with_enough_cores():
    assert auto_cpu_engine(WORKER_MIN_CPUS) == "worker"
    assert auto_cpu_engine(WORKER_MIN_CPUS - 1) == "inline"
    assert auto_cpu_engine(1) == "inline"


def test_a_rank_bound_to_fewer_cores_counts_those():
    """SGLang binds a rank's torch threads to its SGLANG_CPU_OMP_THREADS_BIND group: 1 thread, 1 core."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert rank_cpu_cores() == 1
        assert auto_cpu_engine() == "inline"
    finally:
        torch.set_num_threads(before)
