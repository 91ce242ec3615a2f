"""After `minimize`, the program the user holds keeps Paddle's invariants for its persistable
values, whatever the strategy: every one has a name and the startup program creates it
(support/program_state.py). Compiled in this process for rank 0 of 2 (4 as 2 nodes for
hierarchical all-reduce); the 2-process run through fleetrun, with Paddle's save/load on the
trained program, is tests/runtime/test_saving_compiled_programs.py, and the knob-pairs workers
check the scope after training every pair.
"""
import paddle
import pytest

from fleetlite import DistributedStrategy, Topology
from support import program_state
from support.models import compiled_program

STRATEGIES = {
    "default (copy-free buckets)": ({}, "mlp", "sgd"),
    "unfused": ({"fuse_all_reduce_ops": False}, "mlp", "sgd"),
    "two buckets": ({"fuse_grad_size_in_TFLOPS": 2, "last_comm_group_size_MB": 0}, "convbn", "momentum"),
    "gradient_merge": ({"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}}, "mlp", "momentum"),
    "pto": ({"pto": True}, "mlp", "adam"),
    "topk": ({"topk": True, "topk_configs": {"density": 0.1, "min_numel": 100, "warmup_steps": 2}}, "mlp", "sgd"),
    "dgc": ({"dgc": True, "dgc_configs": {"rampup_begin_step": 1}, "fuse_all_reduce_ops": False}, "mlp", "momentum"),
    "fuse_all_optimizer_ops": ({"build_strategy": {"fuse_all_optimizer_ops": True}}, "mlp", "adam"),
    "sync_batch_norm": ({"sync_batch_norm": True}, "convbn", "momentum"),
    "fp16_allreduce": ({"fp16_allreduce": True}, "mlp", "sgd"),
    "hierarchical": ({"use_hierarchical_allreduce": True}, "mlp", "sgd"),
}
OPTIMIZERS = {"sgd": lambda: paddle.optimizer.SGD(0.1), "momentum": lambda: paddle.optimizer.Momentum(0.1),
              "adam": lambda: paddle.optimizer.Adam(0.01)}


@pytest.mark.parametrize("name", STRATEGIES)
def test_every_persistable_value_is_named_and_created_by_the_startup_program(name):
    fields, model, optimizer = STRATEGIES[name]
    strategy = DistributedStrategy()
    for field, value in fields.items():
        setattr(strategy, field, value)
    paddle.enable_static()
    topology = Topology.grid(4, 2, rank=0) if strategy.use_hierarchical_allreduce else Topology.grid(2, 1, rank=0)
    main, startup, built = compiled_program(strategy, topology, model, optimizer=OPTIMIZERS[optimizer]())
    assert program_state.problems(main, startup) == []
    names = program_state.persistable_names(main)
    assert {p.name for p, _ in built.params_grads} <= set(names)
    if built.report.buckets and built.report.buckets[0]["path"] == "copy-free":
        assert {f"{p}@GRAD" for p in built.report.buckets[0]["gradients"]} <= set(names)
