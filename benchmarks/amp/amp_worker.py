"""One process of an AMP contender: a conv net or the step benchmark's MLP, trained by fleetlite in
float32 or with bfloat16 O1 AMP, 20 steps per sample (step_worker.fleetlite_static).

    python -m benchmarks.amp.amp_worker MODEL PRECISION BATCH     (started by amp_bf16.py; MODEL: convnet | mlp)
"""
import sys

import numpy as np

from benchmarks.step_overhead.step_worker import fleetlite_static
from benchmarks.harness.worker_loop import serve

IMAGE = (3, 32, 32)
PRECISIONS = {"fp32": {}, "bf16_o1": {"amp": True, "amp_configs": {"dtype": "bfloat16"}}}


def convnet(nn):
    """conv-bn-relu twice, max pooling, a linear classifier: the shape of a small image model."""
    return nn.Sequential(nn.Conv2D(3, 32, 3, padding=1), nn.BatchNorm2D(32), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Conv2D(32, 64, 3, padding=1), nn.BatchNorm2D(64), nn.ReLU(), nn.MaxPool2D(2),
                         nn.Flatten(), nn.Linear(64 * 8 * 8, 10))


def images(batch):
    rng = np.random.RandomState(0)
    return rng.rand(batch, *IMAGE).astype("float32"), rng.randint(0, 10, (batch, 1)).astype("int64")


def contender(model, precision, batch):
    if model == "mlp":
        return fleetlite_static(batch, **PRECISIONS[precision])
    return fleetlite_static(batch, convnet, IMAGE, images, **PRECISIONS[precision])


if __name__ == "__main__":
    serve(*contender(sys.argv[1], sys.argv[2], int(sys.argv[3])))
