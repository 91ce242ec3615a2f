"""One rank of the accuracy benchmark's PyTorch job: the digits example's models and training in
PyTorch DDP over gloo, dense or with PyTorch's PowerSGD communication hook (the compression peer).

    python -m benchmarks.topk.powersgd_digits_worker      (started by topk_accuracy.py, one process per rank;
                                           needs torch: the `bench` extra)

A "train" request {model, rank, seed, epochs, count_bytes} trains the same architecture as
examples/train_digits.py (MLP 64-128-10 or the two-convolution net) on the same split of
scikit-learn's digits, global batch 64, SGD with momentum 0.9 and learning rate 0.05, mean
cross-entropy; `rank` 0 means plain DDP (dense all-reduce), r >= 1 PowerSGD of rank r
(powerSGD_hook with error feedback and warm start, compressing from step 2, a matrix compressed
when that saves at least 2x: PyTorch's defaults but for start_powerSGD_iter, whose default 1000
would outlast the run). It answers the test accuracy, the steps, the bytes per rank the formula
predicts per step (module topk_contenders' ring all-reduce of the uncompressed tensors, and of P
and Q) and, with count_bytes, the bytes the namespace's loopback carried per training step.
"""
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook

from benchmarks.harness.network_namespace import own_loopback_bytes
from benchmarks.topk.topk_accuracy_worker import GLOBAL_BATCH, HIDDEN, LEARNING_RATE
from benchmarks.topk.topk_contenders import allreduce_ring_bytes
from benchmarks.harness.worker_loop import answer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from train_digits import load_data  # noqa: E402

MIN_COMPRESSION_RATE = 2


def model(kind):
    if kind == "mlp":
        return torch.nn.Sequential(torch.nn.Linear(64, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, 10))
    return torch.nn.Sequential(torch.nn.Unflatten(1, (1, 8, 8)),
                               torch.nn.Conv2d(1, 16, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Flatten(), torch.nn.Linear(32 * 8 * 8, 10))


def predicted_bytes(parameters, rank, world):
    """Per rank per step: dense, one ring all-reduce of every gradient; PowerSGD, of the tensors it
    leaves uncompressed (vectors, and matrices n x m with n*m < 2 (n+m) r) and of P (n x r) and Q (m x r)."""
    elements = 0
    for p in parameters:
        n, m = p.shape[0], p[0].numel() if p.dim() > 1 else 1
        compressed = rank and p.dim() > 1 and n * m >= MIN_COMPRESSION_RATE * (n + m) * rank
        elements += (n + m) * rank if compressed else p.numel()
    return allreduce_ring_bytes(4 * elements, world)


def train(request, data):
    world = dist.get_world_size()
    x_train, x_test, y_train, y_test = (torch.from_numpy(a) for a in data)
    torch.manual_seed(request["seed"])
    net = torch.nn.parallel.DistributedDataParallel(model(request["model"]))
    rank = request["rank"]
    if rank:
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                            start_powerSGD_iter=2, min_compression_rate=MIN_COMPRESSION_RATE,
                                            random_seed=request["seed"])
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    optimizer = torch.optim.SGD(net.parameters(), lr=LEARNING_RATE, momentum=0.9)
    sampler = torch.utils.data.DistributedSampler(torch.utils.data.TensorDataset(x_train), seed=request["seed"],
                                                  drop_last=True)
    per_rank = GLOBAL_BATCH // world
    dist.barrier()
    before = own_loopback_bytes() if request["count_bytes"] else None
    steps = 0
    for epoch in range(request["epochs"]):
        sampler.set_epoch(epoch)
        order = list(sampler)
        for start in range(0, len(order) - per_rank + 1, per_rank):
            rows = order[start:start + per_rank]
            loss = torch.nn.functional.cross_entropy(net(x_train[rows]), y_train[rows, 0])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            steps += 1
    dist.barrier()
    after = own_loopback_bytes() if request["count_bytes"] else None
    with torch.no_grad():
        accuracy = (net.module(x_test).argmax(1) == y_test[:, 0]).float().mean().item()
    return {"accuracy": accuracy, "steps": steps, "final_loss": loss.item(),
            "bytes_per_step": (after - before) / steps if before is not None else None,
            "predicted_bytes_per_rank": predicted_bytes(list(net.parameters()), rank, world)}


def main():
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    data = load_data()
    answer({"train": lambda request: train(request, data)})


if __name__ == "__main__":
    main()
