"""One rank of a ResNet-50 training-step contender: paddle.vision.models.resnet50() (torch: the
same architecture), SGD, 32x32 images, STEPS steps per sample.

    python -m benchmarks.step_overhead.resnet50_worker CONTENDER BATCH_PER_RANK     (started by resnet50_step.py)

The images are small so a step is short, but the gradients are the full model's (161 tensors,
97.5 MiB): the sync is what grows between one process and two.
"""
import sys

import numpy as np

from benchmarks.step_overhead import step_worker
from benchmarks.harness.worker_loop import serve

STEPS = 2
SIDE = 32
CLASSES = 1000


def data(batch):
    rng = np.random.RandomState(0)
    return (rng.rand(batch, 3, SIDE, SIDE).astype("float32"),
            rng.randint(0, CLASSES, (batch, 1)).astype("int64"))


def fleetlite(batch):
    """fleetlite with the CPU preset; info: what the bucket kernels found in place so far."""
    import paddle
    from fleetlite.compile import bucket_views
    step, barrier = step_worker.fleetlite_static(batch, model=lambda nn: paddle.vision.models.resnet50(num_classes=CLASSES),
                                     sample_shape=(3, SIDE, SIDE), make_data=data, steps=STEPS)
    return step, barrier, lambda: bucket_views.counts() if bucket_views.load_error() is None else None


def paddle_dataparallel(batch):
    import paddle
    return step_worker.paddle_dataparallel(batch, lambda nn: paddle.vision.models.resnet50(num_classes=CLASSES),
                                           data, STEPS)


def torch_resnet50(nn):
    """torchvision's resnet50() architecture from `torch.nn` (torchvision is not a dependency here)."""

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, planes, stride, downsample):
            super().__init__()
            width, out = planes, planes * 4
            self.conv1, self.bn1 = nn.Conv2d(inplanes, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2, self.bn2 = nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.relu, self.downsample = nn.ReLU(inplace=True), downsample

        def forward(self, x):
            identity = x if self.downsample is None else self.downsample(x)
            y = self.relu(self.bn1(self.conv1(x)))
            y = self.relu(self.bn2(self.conv2(y)))
            return self.relu(self.bn3(self.conv3(y)) + identity)

    layers, inplanes = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
                        nn.MaxPool2d(3, 2, 1)], 64
    for planes, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for index in range(blocks):
            down = None
            if index == 0 and (stride != 1 or inplanes != planes * 4):
                down = nn.Sequential(nn.Conv2d(inplanes, planes * 4, 1, stride, bias=False), nn.BatchNorm2d(planes * 4))
            layers.append(Bottleneck(inplanes, planes, stride if index == 0 else 1, down))
            inplanes = planes * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, CLASSES)]
    return nn.Sequential(*layers)


def torch_ddp(batch):
    return step_worker.torch_ddp(batch, torch_resnet50, data, STEPS)


CONTENDERS = {"fleetlite": fleetlite, "paddle_dataparallel": paddle_dataparallel, "torch_ddp": torch_ddp}

if __name__ == "__main__":
    serve(*CONTENDERS[sys.argv[1]](int(sys.argv[2])))
