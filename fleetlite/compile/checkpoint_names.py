"""Find recompute's checkpoints in the program: each entry of recompute_configs.checkpoints is a
value token (the strategy's record of a PIR value, fleetlite.strategy.checkpoint_values) or a
layer name, the output of the layer whose parameters are `<name>.*` (what a YAML file can say,
and what fleet.train_step's traced programs keep: their parameters carry the eager names).
"""
from fleetlite.compile import program_edit
from fleetlite.errors import CompileError
from fleetlite.strategy import checkpoint_values


def resolve(entries, forward):
    """The checkpoint values of `entries` among the `forward` ops (program order); a layer called
    several times gives the output of each call."""
    return [value for entry in entries for value in _values_of(entry, forward)]


def _values_of(entry, forward):
    token = checkpoint_values.parsed(entry)
    if token is not None:
        name, op_id, index = token
        for op in forward:
            if op.id() == op_id and op.name() == name:
                return [op.result(index)]
        raise CompileError(f"recompute checkpoint {entry} is no forward value of the program being compiled: set "
                           f"recompute_configs.checkpoints to values of this program's forward, after building it "
                           f"and before distributed_optimizer(...).minimize(loss)")
    outputs = layer_outputs(entry, forward)
    if not outputs:
        layers = sorted(layer_names(forward))
        shown = ", ".join(layers[:8]) + (", ..." if len(layers) > 8 else "")
        raise CompileError(f"recompute checkpoint '{entry}' names no layer of this program: a name is a layer's, "
                           f"whose parameters are '<name>.*' (here: {shown or 'none'}); or set the PIR values "
                           f"themselves: recompute_configs = {{'checkpoints': [h1, h2]}}")
    return outputs


def _parameter_name(value):
    producer = value.get_defining_op()
    if producer is None or producer.name() != "builtin.parameter":
        return None
    return producer.attrs()["parameter_name"]


def layer_names(forward):
    """The layers whose parameters the forward reads: 'linear_0' of 'linear_0.w_0'."""
    return {name.rsplit(".", 1)[0] for op in forward for source in op.operands_source()
            for name in [_parameter_name(source)] if name and "." in name}


def layer_outputs(layer, forward):
    """The outputs of `layer`'s calls: of the forward ops that read its parameters (or values made
    from them alone, such as a reshaped bias) together with other inputs, the results no other such
    op reads (a Linear's matmul feeds its bias add: the add's result is the output)."""
    derived, readers = set(), []
    for op in forward:
        own = [program_edit.key(s) in derived or (_parameter_name(s) or "").startswith(layer + ".")
               for s in op.operands_source()]
        if all(own) and own:
            derived.update(program_edit.key(result) for result in op.results())
        elif any(own):
            readers.append(op)
    read_by_layer = {program_edit.key(s) for op in readers for s in op.operands_source()}
    return [op.result(0) for op in readers if program_edit.key(op.result(0)) not in read_by_layer]
