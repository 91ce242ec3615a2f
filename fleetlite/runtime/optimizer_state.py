"""`opt.state_dict()` and `opt.set_state_dict()` of a dygraph script that trains by fleet.train_step.

The compiled program keeps the optimizer's state (moments, the learning-rate variable, and what
passes add: gradient-merge buffers, top-k residuals) in its scope, not in the eager optimizer.
Its state is every variable the startup program initialises other than the model's parameters
and the learning rate, plus the LR scheduler's state under "LR_Scheduler". A variable named
after a parameter (`linear_0.w_0_moment1_0`) is keyed by the parameter's structured name and
the accumulator (`hidden.weight_moment1`): variable names carry unique-name counters that
differ between a script and its resumed run, structured names do not. `state_dict()` returns a snapshot (eager Tensors) that `paddle.save`
writes; a state set before the first step (a resume) is loaded once the program exists. Under
pto each rank holds only its part, so every rank must call `state_dict()` (it gathers).
"""
import re

import numpy as np
import paddle
from paddle.optimizer.lr import LRScheduler

from fleetlite.errors import DygraphError

SCHEDULER = "LR_Scheduler"


class CompiledOptimizerState:
    def __init__(self, optimizer):
        self._optimizer = optimizer
        self._scope = None
        self._keys = {}
        self._others = dict       # pto: {variable: value} of the other ranks' parts
        self._pending = None

    def bind(self, scope, keys, others=None):
        """Hold the state variables of `scope` that `keys` ({variable name: state key}) names;
        load a state set before this."""
        self._scope, self._keys = scope, dict(keys)
        self._others = others or dict
        if self._pending is not None:
            self._load(self._pending)
            self._pending = None

    @property
    def bound(self):
        """Whether a compiled program holds the state (fleet.train_step ran its first step)."""
        return self._scope is not None

    def state_dict(self):
        state = {}
        if self._scope is None:
            state.update(self._pending or {})
        else:
            others = self._others()
            for name, key in self._keys.items():
                tensor = self._scope.find_var(name).get_tensor()
                if name in others:
                    state[key] = paddle.to_tensor(others[name])
                elif tensor._is_initialized():
                    state[key] = paddle.to_tensor(np.array(tensor))
        scheduler = self._optimizer._learning_rate
        if isinstance(scheduler, LRScheduler):
            state[SCHEDULER] = scheduler.state_dict()
        return state

    def set_state_dict(self, state):
        state = dict(state)
        scheduler_state = state.pop(SCHEDULER, None)
        scheduler = self._optimizer._learning_rate
        if isinstance(scheduler, LRScheduler) and scheduler_state is not None:
            scheduler.set_state_dict(scheduler_state)
        if self._scope is None:
            self._pending = state
        else:
            self._load(state)

    def _load(self, state):
        missing = [key for key in self._keys.values() if key not in state]
        if missing:
            raise DygraphError(f"the optimizer state lacks {', '.join(missing[:3])}"
                               f"{' and others' if len(missing) > 3 else ''}: load a state_dict() saved by the "
                               f"same model, optimizer and strategy ")
        place = paddle.framework._current_expected_place()
        for name, key in self._keys.items():
            value = state[key]
            array = value.numpy() if isinstance(value, paddle.Tensor) else np.asarray(value)
            self._scope.var(name).get_tensor().set(array, place)


def state_keys(names, structured):
    """{variable name: state key} for the state variables `names`, given {parameter variable
    name: structured name} of the model."""
    keys = {}
    by_length = sorted(structured, key=len, reverse=True)
    for name in names:
        owner = next((param for param in by_length if name.startswith(param + "_")), None)
        keys[name] = name if owner is None else structured[owner] + re.sub(r"_\d+$", "", name[len(owner):])
    return keys
