"""Trace an eager model and its loss function into one PIR program: the forward and the loss.

`paddle.jit.to_static(full_graph=True)` turns `loss_fn(model, *batch)` into a program whose
parameters carry the eager parameters' names, which fleetlite's unchanged compiler then
rewrites (see train_step). The batch dimension of every input is left free, so one program
serves every batch size (a short last batch included); any other dimension and the dtypes are
fixed by the first batch. The model is traced in train mode whatever mode it is in: dropout and
batch norm are fixed when the program is built, and `step` trains.
"""
import numpy as np
import paddle
from paddle.static import InputSpec

from fleetlite.errors import DygraphError


def signature(batch):
    """((shape after the batch dimension, dtype name), ...) of a batch of arrays or Tensors."""
    described = []
    for position, value in enumerate(batch):
        if isinstance(value, paddle.Tensor):
            shape, dtype = tuple(value.shape), str(value.dtype).replace("paddle.", "")
        elif isinstance(value, np.ndarray):
            shape, dtype = value.shape, value.dtype.name
        else:
            raise DygraphError(f"fleet.train_step got a {type(value).__name__} as batch input {position}: "
                               f"pass NumPy arrays or paddle Tensors")
        if not shape:
            raise DygraphError(f"fleet.train_step got a scalar as batch input {position}: every input needs "
                               f"a batch dimension first")
        described.append((tuple(shape[1:]), dtype))
    return tuple(described)


def describe(batch_signature):
    return ", ".join(f"[batch, {', '.join(map(str, shape))}] {dtype}".replace(", ]", "]")
                     for shape, dtype in batch_signature)


def input_names(batch_signature):
    """The program's input names, in batch order."""
    return tuple(f"batch_{i}" for i in range(len(batch_signature)))


def trace(model, loss_fn, batch_signature):
    """The ConcreteProgram of `loss_fn(model, *batch)` for batches of `batch_signature`."""
    specs = [InputSpec([None, *shape], dtype, name)
             for (shape, dtype), name in zip(batch_signature, input_names(batch_signature))]

    def loss_of(batch):
        return loss_fn(model, *batch)

    modes = [(layer, layer.training) for layer in model.sublayers(include_self=True)]
    model.train()
    try:
        program = paddle.jit.to_static(loss_of, input_spec=[specs], full_graph=True).concrete_program
    except Exception as exc:
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise DygraphError(f"fleet.train_step could not trace loss_fn(model, *batch) into a static program "
                           f"({type(exc).__name__}: {first_line}): loss_fn and the model's forward must be code "
                           f"paddle.jit.to_static(full_graph=True) converts (no NumPy or Python values read "
                           f"from tensors)") from exc
    finally:
        for layer, training in modes:
            layer.training = training
    outputs = program.outputs
    if len(outputs) != 1 or outputs[0].shape not in ([], [1]):
        shapes = ", ".join(str(list(value.shape)) for value in outputs)
        raise DygraphError(f"loss_fn(model, *batch) must return one scalar loss; it returned values of shape "
                           f"{shapes}: reduce it (e.g. .mean()) inside loss_fn")
    return program
