"""Train an MLP (or a small conv net) on scikit-learn's digits, written in dygraph (eager) style.

    fleetrun --nproc_per_node 2 examples/train_digits_dygraph.py --strategy configs/cpu_gloo.yaml [--model conv]

The dygraph twin of train_digits.py: the model is an ordinary eager Layer, `fleet.train_step`
traces it once and trains it through fleetlite's compiled program (every strategy knob), and
evaluation, `state_dict` and `paddle.save` are plain eager code on the same parameters. With
--checkpoint_dir, model and optimizer are saved after every epoch and a restarted job resumes.
"""
import os
import time

import numpy as np
import paddle

import fleetlite as fleet
import fleetlite.data
from train_digits import MODELS, Digits, load_data, parse_args   # the same flags


def loss_fn(model, x, label):
    return paddle.nn.functional.cross_entropy(model(x), label)


def evaluate(model, test_set, strategy):
    """(accuracy, samples) over every rank's share of `test_set`, each sample counted once."""
    model.eval()
    correct = seen = 0
    with paddle.no_grad():
        for x, label in fleetlite.data.loader(test_set, strategy, 64, evaluation=True):
            predicted = paddle.argmax(model(x), axis=1).numpy()
            correct += int((predicted == np.array(label)[:, 0]).sum())
            seen += len(predicted)
    model.train()
    correct, count = fleetlite.data.all_reduce_sums([correct, seen])
    return correct / count, int(count)


def restore(checkpoint, model, optimizer):
    """The first epoch to train: after the last saved one, if a checkpoint exists."""
    if not checkpoint or not os.path.exists(checkpoint + ".pdopt"):
        return 0
    model.set_state_dict(paddle.load(checkpoint + ".pdparams"))
    state = paddle.load(checkpoint + ".pdopt")
    optimizer.set_state_dict(state)
    return int(state["epoch"]) + 1


def save(checkpoint, model, optimizer, epoch):
    state = optimizer.state_dict()            # every rank: under pto the ranks' parts are gathered
    if fleet.is_first_worker():
        paddle.save(model.state_dict(), checkpoint + ".pdparams")
        paddle.save({**state, "epoch": epoch}, checkpoint + ".tmp")
        os.replace(checkpoint + ".tmp", checkpoint + ".pdopt")      # written last: marks a whole checkpoint
    fleet.barrier_worker()


def main():
    args = parse_args()
    strategy = fleet.DistributedStrategy.load(args.strategy) if args.strategy else fleet.DistributedStrategy()
    fleet.init(is_collective=True, strategy=strategy)
    rank, world = fleet.worker_index(), fleet.worker_num()
    if args.batch_size % world:
        raise SystemExit(f"--batch_size {args.batch_size} must be divisible by the {world} workers")
    paddle.seed(0)
    model = fleet.distributed_model(MODELS[args.model](args.hidden))
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(args.lr, momentum=0.9,
                                                                      parameters=model.parameters()))
    step = fleet.train_step(model, loss_fn, optimizer)    # the first call traces, compiles, prints the report
    checkpoint = os.path.join(args.checkpoint_dir, "digits_dygraph") if args.checkpoint_dir else None
    first_epoch = restore(checkpoint, model, optimizer)
    if first_epoch and rank == 0:
        print(f"resumed from {checkpoint} at epoch {first_epoch}", flush=True)

    x_train, x_test, y_train, y_test = load_data()
    train = fleetlite.data.loader(Digits(x_train, y_train), strategy, args.batch_size // world, drop_last=True)
    train.batch_sampler.set_epoch(first_epoch)
    for epoch in range(first_epoch, args.epochs):
        started = time.perf_counter()
        losses = [float(step(x, label)) for x, label in train]
        elapsed = time.perf_counter() - started
        if rank == 0:
            print(f"epoch {epoch}: loss {np.mean(losses):.4f} (last step {losses[-1]:.4f}), "
                  f"{len(losses) * args.batch_size / elapsed:.0f} samples/s over {world} workers", flush=True)
        if checkpoint:
            save(checkpoint, model, optimizer, epoch)

    accuracy, count = evaluate(model, Digits(x_test, y_test), strategy)
    if rank == 0:
        print(f"test accuracy {accuracy:.4f} on {count} held-out digits", flush=True)


if __name__ == "__main__":
    main()
