"""Train an MLP (or a small conv net) on scikit-learn's digits, data parallel, with a strategy file.

    fleetrun --nproc_per_node 2 examples/train_digits.py --strategy configs/cpu_gloo.yaml [--model conv]

The data come from `fleetlite.data.loader` (the strategy's data_configs pick the sampler): each
step every rank takes its slice of the same global batch, so N processes follow the trajectory
of one process on the full batch, and the test accuracy is summed over the ranks, each sample
counted once. With --checkpoint_dir, the parameters and optimizer state are saved after every
epoch, as the folder `epoch_<N>`, and a restarted job (fleetrun --max_restarts) resumes from the
newest one where the uninterrupted job would have been (tests/runtime/test_example_resume.py).
"""
import argparse
import os
import shutil
import time

import numpy as np
import paddle
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

import fleetlite as fleet
import fleetlite.data


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default=None, help="a .yaml or .prototxt strategy file")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=64, help="global batch, split over ranks")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--model", choices=sorted(MODELS), default="mlp")
    parser.add_argument("--hidden", type=int, default=128, help="the MLP's hidden units")
    parser.add_argument("--checkpoint_dir", default=None)
    return parser.parse_args()


def load_data():
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int64").reshape(-1, 1)
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=digits.target)


class Digits(paddle.io.Dataset):
    def __init__(self, x, y):
        self.x, self.y, self.labels = x, y, y[:, 0]

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def mlp(hidden):
    return paddle.nn.Sequential(paddle.nn.Linear(64, hidden), paddle.nn.ReLU(), paddle.nn.Linear(hidden, 10))


def conv(hidden):
    """Two 3x3 convolutions on the 8x8 image and a linear classifier (`hidden` is the MLP's)."""
    return paddle.nn.Sequential(paddle.nn.Unflatten(1, [1, 8, 8]),
                                paddle.nn.Conv2D(1, 16, 3, padding=1), paddle.nn.ReLU(),
                                paddle.nn.Conv2D(16, 32, 3, padding=1), paddle.nn.ReLU(),
                                paddle.nn.Flatten(), paddle.nn.Linear(32 * 8 * 8, 10))


MODELS = {"mlp": mlp, "conv": conv}


def build(hidden, lr, strategy, model="mlp"):
    """The training and test programs; the compile report says what fleetlite did to the first."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 64], "float32")
        label = paddle.static.data("label", [None, 1], "int64")
        logits = MODELS[model](hidden)(x)
        loss = paddle.nn.functional.cross_entropy(logits, label)
        mapping = paddle.pir.IrMapping()  # the clone's values, to fetch its logits
        test_program = main.clone(mapping)
        test_logits = mapping.look_up(logits)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(lr, momentum=0.9), strategy)
        optimizer.minimize(loss)
    return main, startup, test_program, loss, test_logits, optimizer.compile_report


CHECKPOINT_PREFIX = "epoch_"


def latest_checkpoint(directory):
    """(epoch, folder) of the newest checkpoint in `directory`, or (None, None).

    Each checkpoint is the folder `epoch_<N>` that fleet.save_persistables wrote after epoch N:
    the epoch is saved with the parameters, since the folder appears complete or not at all."""
    if not directory or not os.path.isdir(directory):
        return None, None
    epochs = [int(name[len(CHECKPOINT_PREFIX):]) for name in os.listdir(directory)
              if name.startswith(CHECKPOINT_PREFIX) and name[len(CHECKPOINT_PREFIX):].isdigit()]
    if not epochs:
        return None, None
    return max(epochs), os.path.join(directory, f"{CHECKPOINT_PREFIX}{max(epochs)}")


def save_checkpoint(exe, directory, main, epoch):
    """Every rank calls it: the first worker writes parameters and optimizer state (velocities,
    learning rate; under pto every rank's shard) as `epoch_<epoch>`, then drops the older ones."""
    fleet.save_persistables(exe, os.path.join(directory, f"{CHECKPOINT_PREFIX}{epoch}"), main)
    if fleet.is_first_worker():
        for name in os.listdir(directory):
            if name.startswith(CHECKPOINT_PREFIX) and name != f"{CHECKPOINT_PREFIX}{epoch}":
                shutil.rmtree(os.path.join(directory, name))


def restore_checkpoint(exe, directory, main):
    """The epoch to start from: 0, or the one after the newest checkpoint, loaded on every rank."""
    epoch, folder = latest_checkpoint(directory)
    if epoch is None:
        return 0
    fleet.load_model(folder, executor=exe, main_program=main)
    return epoch + 1


def run_epoch(exe, main_program, loss, train):
    """One pass over this rank's batches; the losses, step by step."""
    return [float(exe.run(main_program, feed={"x": x, "label": label}, fetch_list=[loss])[0]) for x, label in train]


def evaluate(exe, test_program, test_logits, test_set, strategy):
    """(accuracy, samples) over every rank's share of `test_set`, each sample counted once."""
    correct = seen = 0
    for x, label in fleetlite.data.loader(test_set, strategy, 64, evaluation=True):
        (scores,) = exe.run(test_program, feed={"x": x, "label": label}, fetch_list=[test_logits])
        correct += int((np.argmax(scores, axis=1) == np.array(label)[:, 0]).sum())
        seen += len(scores)
    correct, count = fleetlite.data.all_reduce_sums([correct, seen])
    return correct / count, int(count)


def main():
    args = parse_args()
    paddle.enable_static()
    strategy = fleet.DistributedStrategy.load(args.strategy) if args.strategy else fleet.DistributedStrategy()
    fleet.init(is_collective=True, strategy=strategy)
    rank, world = fleet.worker_index(), fleet.worker_num()
    if args.batch_size % world:
        raise SystemExit(f"--batch_size {args.batch_size} must be divisible by the {world} workers")
    paddle.seed(0)
    main_program, startup, test_program, loss, test_logits, _ = build(args.hidden, args.lr, strategy, args.model)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    first_epoch = restore_checkpoint(exe, args.checkpoint_dir, main_program)
    if first_epoch and rank == 0:
        print(f"resumed from {args.checkpoint_dir} at epoch {first_epoch}", flush=True)

    x_train, x_test, y_train, y_test = load_data()
    train = fleetlite.data.loader(Digits(x_train, y_train), strategy, args.batch_size // world, drop_last=True)
    train.batch_sampler.set_epoch(first_epoch)
    for epoch in range(first_epoch, args.epochs):
        started = time.perf_counter()
        losses = run_epoch(exe, main_program, loss, train)
        elapsed = time.perf_counter() - started
        if rank == 0:
            throughput = len(losses) * args.batch_size / elapsed
            print(f"epoch {epoch}: loss {np.mean(losses):.4f} (last step {losses[-1]:.4f}), "
                  f"{throughput:.0f} samples/s over {world} workers", flush=True)
        if args.checkpoint_dir:
            save_checkpoint(exe, args.checkpoint_dir, main_program, epoch)
        fleet.barrier_worker()

    accuracy, count = evaluate(exe, test_program, test_logits, Digits(x_test, y_test), strategy)
    if rank == 0:
        print(f"test accuracy {accuracy:.4f} on {count} held-out digits", flush=True)


if __name__ == "__main__":
    main()
