"""The rules `data_configs` must meet, in one table read by both `DistributedStrategy.validate`
and the loaders, so `fleetlite strategy validate` refuses every setting a loader would refuse.

Each rule names the field the user set, the cause and the fix. A rule sees the section and the
job's topology (None where none is declared yet: `fleetlite strategy validate` without a job);
rules that need the topology pass when it is None. What only a loader call can know (the
dataset, batch_size, which loader function the script calls) is checked in that loader.
"""
from collections import namedtuple

from fleetlite.errors import DataSettingsError

LEVELS = ("disk", "memory")
ANY_LOADER_SAMPLER = "distributed"

Rule = namedtuple("Rule", "field test fix")


def unknown_or_repeated_levels(levels):
    """The problem with a list of cache levels (unknown or repeated names), or None."""
    levels = list(levels)
    unknown = [level for level in levels if level not in LEVELS]
    if unknown:
        return f"lists {', '.join(map(repr, unknown))}, which is not a cache level"
    repeated = sorted({level for level in levels if levels.count(level) > 1})
    if repeated:
        return f"lists {', '.join(map(repr, repeated))} more than once"
    return None


def _levels(config, topology):
    problem = unknown_or_repeated_levels(config.cache_levels)
    return problem and f"data_configs.cache_levels = {list(config.cache_levels)} {problem}"


def _empty_cache_dir(config, topology):
    if "disk" in config.cache_levels and not config.cache_dir.strip():
        return ("data_configs.cache_dir is empty, but cache_levels has 'disk', whose copies live there "
                "(an empty path would fill the working directory)")
    return None


def _memory_without_room(config, topology):
    if "memory" in config.cache_levels and config.memory_cache_MB == 0:
        return "data_configs.memory_cache_MB = 0, but cache_levels has 'memory': a store of 0 MiB keeps no sample"
    return None


def _dali_sampler(config, topology):
    if config.loader == "dali" and config.sampler != ANY_LOADER_SAMPLER:
        return (f"data_configs.sampler = {config.sampler!r}, but loader 'dali' batches with the distributed "
                f"sampler only (node partition with cache_levels)")
    return None


def _dali_gpu_error_policy(config, topology):
    if (topology is not None and topology.device == "gpu" and config.loader == "dali"
            and not config.cache_levels and config.equal_batches == "error"):
        return ("data_configs.equal_batches = 'error' is not available with DALI's GPU iterator "
                "(loader 'dali' without cache_levels on GPU)")
    return None


RULES = (
    Rule("data_configs.cache_levels", _levels, "list each of 'disk', 'memory' at most once"),
    Rule("data_configs.cache_dir", _empty_cache_dir,
         "set cache_dir to a local folder, e.g. ~/.cache/fleetlite/samples, or drop 'disk'"),
    Rule("data_configs.memory_cache_MB", _memory_without_room,
         "set memory_cache_MB >= 1, or drop 'memory' from cache_levels"),
    Rule("data_configs.sampler", _dali_sampler,
         "set sampler: distributed, or loader: paddle and fleetlite.data.loader(dataset, strategy) for the pk and "
         "class_balanced samplers"),
    Rule("data_configs.equal_batches", _dali_gpu_error_policy, "use equal_batches 'pad' or 'drop'"),
)


def check(config, topology=None):
    """Raise DataSettingsError (a StrategyConflictError and a DataError) for the first rule that
    `config` (a DataConfig message) breaks."""
    for rule in RULES:
        problem = rule.test(config, topology)
        if problem:
            name = rule.field.split(".", 1)[1]
            value = getattr(config, name)
            raise DataSettingsError(problem, field=rule.field, value=value if isinstance(value, (str, int)) else
                                    list(value), fix=rule.fix)
