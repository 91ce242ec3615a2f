"""The oracle of the local SGD tests, in plain Python: Fleet's sync rule (localsgd and
adaptive_localsgd, as paddle/distributed/fleet/meta_optimizers/localsgd_optimizer.py builds them)
and a one-process simulation of N ranks (N copies of the model, each trained on its rank's rows,
their parameters averaged after the update on the sync steps).
"""
import math

import numpy as np
import paddle


class FleetSchedule:
    """Fleet's rule, one step at a time. `adaptive` follows AdaptiveLocalSGDOptimizer (k from the
    loss and the learning rate, last_sync from 0), else LocalSGDOptimizer (fixed k, last_sync
    from begin_step). Losses and ratios in float32, as the program computes them."""

    def __init__(self, begin_step, k_steps, adaptive=False):
        self.begin, self.k, self.init_k, self.adaptive = begin_step, k_steps, k_steps, adaptive
        self.last = 0 if adaptive else begin_step
        self.loss_0 = self.lr_0 = None

    def sync(self, step, mean_loss=None, lr=None):
        """Whether the ranks average after the update of `step` (1 on the first run); updates k."""
        if self.adaptive and step == 1:
            self.loss_0, self.lr_0 = np.float32(mean_loss), np.float32(lr)
        due = step <= self.begin or step - self.last == self.k
        if due:
            self.last = step
            if self.adaptive and step > self.begin:
                ratio = self.lr_0 * np.float32(mean_loss) / (np.float32(lr) * self.loss_0) * np.float32(self.init_k)
                self.k = min(max(math.ceil(np.sqrt(np.float32(ratio))), 1), 16)
        return due


def mean_loss(losses):
    """The ranks' mean loss as the program computes it: the float32 sum, times 1/N."""
    return np.float32(np.sum(np.asarray(losses, dtype="float32"), dtype="float32")) * np.float32(1.0 / len(losses))


def simulate(build, initial, feeds, schedule, lr):
    """Train len(feeds[0]) copies of the program `build()` -> (main, startup, loss, param names)
    from `initial` {name: values}; feeds[step][copy] is that copy's feed. Returns (losses per step
    per copy, params per step per copy {name: values}, sync flags)."""
    main, startup, loss, names = build()
    exe = paddle.static.Executor(paddle.CPUPlace())
    scopes = [paddle.static.Scope() for _ in feeds[0]]
    for scope in scopes:
        with paddle.static.scope_guard(scope):
            exe.run(startup)
            for name, value in initial.items():
                scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
    losses, params, syncs = [], [], []
    for step, step_feeds in enumerate(feeds, start=1):
        step_losses = []
        for scope, feed in zip(scopes, step_feeds):
            with paddle.static.scope_guard(scope):
                step_losses.append(float(exe.run(main, feed=feed, fetch_list=[loss])[0]))
        synced = schedule.sync(step, mean_loss(step_losses), lr)
        if synced:
            for name in names:
                values = [np.array(scope.find_var(name).get_tensor()) for scope in scopes]
                average = np.mean(values, axis=0, dtype="float32")
                for scope in scopes:
                    scope.find_var(name).get_tensor().set(average, paddle.CPUPlace())
        losses.append(step_losses)
        params.append([{n: np.array(scope.find_var(n).get_tensor()) for n in names} for scope in scopes])
        syncs.append(synced)
    return losses, params, syncs
