"""bench/op_count.py's count of one decode layer-step of the CUDA plan (torch profiler on CPU): the
eager step and the step a decode CUDA graph holds (padding rows -1, padded=True) read nothing back to
the host, and call each device kernel the number of times the README states. Counts, not timings."""

from bench.op_count import count_plan_ops


def test_the_eager_and_the_graph_step_read_nothing_back_and_launch_what_is_stated():
    eager = count_plan_ops(batch=4, k=16, slots=64, context=256)
    graph = count_plan_ops(batch=4, k=16, slots=64, context=256, padded=1)
    assert eager["host_reads"] == 0 and graph["host_reads"] == 0
    assert eager["kernel_calls"] == {"resolver": 2, "plan_epilogue": 1, "flashtrans_copy": 1, "flashtrans_move": 1}
    # the graph step writes the newest rows with FlashTrans (skipping padding rows) instead of index_copy_
    assert graph["kernel_calls"] == {**eager["kernel_calls"], "flashtrans_copy": 2}
    assert eager["launch_estimate_cuda"] <= 10
