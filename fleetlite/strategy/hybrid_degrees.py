"""`hybrid_configs` as fleetlite runs it: the dp-only hybrid topology.

Paddle splits the world into data x pipeline x sharding x sequence x context x model (x expert)
groups. fleetlite trains data parallel only, so scripts written for Paddle's hybrid API (PaddleNLP's
`hybrid_configs = {"dp_degree": N, "mp_degree": 1, ...}` and `fleet.get_hybrid_communicate_group()`)
run when every axis but data has degree 1 (0 counts as 1, as in Paddle), and `dp_degree` is the
world size or -1 (the rest of the world). Anything else is refused at `fleet.init` with one line.
"""
from fleetlite.errors import StrategyConflictError

OTHER_AXES = ("mp", "pp", "sharding", "sep", "cp", "ep", "moe_sharding", "cp_sharding")


def check(hybrid, topology=None):
    """Raise StrategyConflictError unless `hybrid` (the hybrid_configs message) is dp-only and,
    with a topology, its dp_degree agrees with the world size."""
    for axis in OTHER_AXES:
        degree = getattr(hybrid, f"{axis}_degree")
        if degree > 1:
            raise StrategyConflictError(
                f"hybrid_configs.{axis}_degree = {degree}, but fleetlite runs data parallelism only",
                field=f"hybrid_configs.{axis}_degree", value=degree,
                fix=f"set {axis}_degree to 1 and let dp_degree span the job (paddle.distributed.fleet runs hybrid parallelism)")
    if hybrid.dp_degree == 0:
        raise StrategyConflictError("hybrid_configs.dp_degree = 0 is no data-parallel degree",
                                    field="hybrid_configs.dp_degree", value=0,
                                    fix="set it to the world size or -1 (the whole world)")
    if topology is not None and hybrid.dp_degree not in (-1, topology.world_size):
        raise StrategyConflictError(
            f"hybrid_configs.dp_degree = {hybrid.dp_degree} but the job has {topology.world_size} ranks "
            f"(with every other degree 1, dp_degree is the world size)",
            field="hybrid_configs.dp_degree", value=hybrid.dp_degree,
            fix=f"set dp_degree to {topology.world_size} or -1")

