"""Each rank all-reduces its rank + 1 a few times and checks the sum: the smallest real job."""
import sys

import paddle
import paddle.distributed as dist

dist.init_parallel_env()
rank, world = dist.get_rank(), dist.get_world_size()
for _ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 3):
    value = paddle.to_tensor([float(rank + 1)])
    dist.all_reduce(value)
    assert value.item() == world * (world + 1) / 2, value.item()
print(f"rank {rank} of {world}: all_reduce ok", flush=True)
