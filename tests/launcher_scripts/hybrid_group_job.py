"""A PaddleNLP-style dygraph script: a dp-only `hybrid_configs`, then the hybrid communicate
group's ranks, sizes and groups; the data group's all_reduce sums over the job, the model
group's leaves the value alone; then one step of Fleet's eager loop on this rank's half of the
batch, against one process's step on the whole batch. Writes OUT/result.<rank>.json.

Usage: hybrid_group_job.py OUT
"""
import json
import sys
from pathlib import Path

import numpy as np
import paddle
import paddle.distributed as dist

import fleetlite as fleet


def main():
    out = Path(sys.argv[1])
    strategy = fleet.DistributedStrategy()
    strategy.hybrid_configs = {"dp_degree": 2, "mp_degree": 1, "pp_degree": 1, "sharding_degree": 1,
                               "order": ["dp", "pp", "sharding", "sep", "mp"],
                               "mp_configs": {"need_broadcast_data": False}, "pp_configs": {"delay_scale_loss": True}}
    fleet.init(is_collective=True, strategy=strategy)
    hcg = fleet.get_hybrid_communicate_group()
    rank = hcg.get_global_rank()
    summed = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(summed, group=hcg.get_data_parallel_group())
    alone = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(alone, group=hcg.get_model_parallel_group())
    result = {"global_rank": rank,
              "data": [hcg.get_data_parallel_rank(), hcg.get_data_parallel_world_size(),
                       hcg.get_data_parallel_group().nranks],
              "model": [hcg.get_model_parallel_rank(), hcg.get_model_parallel_world_size()],
              "pipe": [hcg.get_stage_id(), hcg.get_pipe_parallel_world_size()],
              "sharding": [hcg.get_sharding_parallel_rank(), hcg.get_sharding_parallel_world_size()],
              "data_sum": float(summed.numpy()[0]), "model_sum": float(alone.numpy()[0])}
    result["eager_step_max_difference"] = eager_step_against_full_batch(rank)
    (out / f"result.{rank}.json").write_text(json.dumps(result))


def eager_step_against_full_batch(rank):
    """Max |parameter difference| after one step of the eager loop on 2 ranks and on the full batch."""
    paddle.seed(rank)                        # distributed_model broadcasts rank 0's parameters
    model = paddle.nn.Linear(4, 1)
    model = fleet.distributed_model(model)
    reference = paddle.nn.Linear(4, 1)
    reference.set_state_dict(model._layers.state_dict())
    x = paddle.to_tensor(np.arange(32, dtype="float32").reshape(8, 4) / 10)
    y = paddle.to_tensor(np.linspace(-1, 1, 8, dtype="float32").reshape(8, 1))
    opt = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    half = slice(rank * 4, rank * 4 + 4)
    ((model(x[half]) - y[half]) ** 2).mean().backward()
    opt.step()
    reference_opt = paddle.optimizer.SGD(0.1, parameters=reference.parameters())
    ((reference(x) - y) ** 2).mean().backward()
    reference_opt.step()
    return max(float(np.abs(p.numpy() - r.numpy()).max())
               for p, r in zip(model._layers.parameters(), reference.parameters()))


if __name__ == "__main__":
    main()
