"""A PaddleNLP-style dygraph script: a dp-only `hybrid_configs`, then the hybrid communicate
group's ranks, sizes and groups; the data group's all_reduce sums over the job, the model
group's leaves the value alone. Writes OUT/result.<rank>.json.

Usage: hybrid_group_job.py OUT
"""
import json
import sys
from pathlib import Path

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
    (out / f"result.{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
