"""One rank of a ResNet-50 training-step contender: paddle.vision.models.resnet50() (torch: the
same architecture), SGD, 32x32 images, STEPS steps per sample.

    python resnet50_worker.py CONTENDER BATCH_PER_RANK     (started by resnet50_step.py)

The images are small so a step is short, but the gradients are the full model's (161 tensors,
97.5 MiB): the sync is what grows between one process and two.
"""
import os
import sys

import numpy as np

from step_worker import fleetlite_static
from worker_loop import serve

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
    from fleetlite import bucket_views
    step, barrier = fleetlite_static(batch, model=lambda nn: paddle.vision.models.resnet50(num_classes=CLASSES),
                                     sample_shape=(3, SIDE, SIDE), make_data=data, steps=STEPS)
    return step, barrier, lambda: bucket_views.counts() if bucket_views.load_error() is None else None


def paddle_dataparallel(batch):
    import paddle
    import paddle.distributed as dist
    from paddle.distributed import collective
    paddle.base.core.set_num_threads(1)
    world = int(os.environ["PADDLE_TRAINERS_NUM"])
    if world > 1:
        dist.init_parallel_env()
    model = paddle.vision.models.resnet50(num_classes=CLASSES)
    model = paddle.DataParallel(model) if world > 1 else model
    optimizer = paddle.optimizer.SGD(0.01, parameters=model.parameters())
    xs, ys = (paddle.to_tensor(a) for a in data(batch))

    def step():
        for _ in range(STEPS):
            loss = paddle.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            optimizer.step()
            optimizer.clear_grad(set_to_zero=False)
        float(loss)
    barrier = (lambda: collective._get_default_group().process_group.barrier().wait()) if world > 1 else (lambda: None)
    return step, barrier


def torch_resnet50(torch):
    """torchvision's resnet50() architecture (torchvision is not a dependency here)."""
    nn = torch.nn

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
    import torch
    import torch.distributed as tdist
    torch.set_num_threads(1)
    world = int(os.environ["WORLD_SIZE"])
    model = torch_resnet50(torch)
    if world > 1:
        tdist.init_process_group("gloo")
        model = torch.nn.parallel.DistributedDataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    xs, ys = (torch.from_numpy(a) for a in data(batch))
    ys = ys[:, 0]

    def step():
        for _ in range(STEPS):
            loss = torch.nn.functional.cross_entropy(model(xs), ys)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        float(loss)
    return step, (tdist.barrier if world > 1 else (lambda: None))


CONTENDERS = {"fleetlite": fleetlite, "paddle_dataparallel": paddle_dataparallel, "torch_ddp": torch_ddp}

if __name__ == "__main__":
    serve(*CONTENDERS[sys.argv[1]](int(sys.argv[2])))
