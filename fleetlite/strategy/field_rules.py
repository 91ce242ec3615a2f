"""Allowed values of strategy fields, keyed by dotted field path.

The proto gives names, types and defaults; this table adds the ranges and choices that the type
alone cannot express. It is checked on every assignment and every file load, and the strategy
reference prints each rule beside its field, so users read the same rule that is enforced.
"""
import math


class Range:
    """A closed or half-open numeric interval; None leaves a side unbounded."""

    def __init__(self, low=None, high=None, low_open=False, high_open=False):
        self.low, self.high, self.low_open, self.high_open = low, high, low_open, high_open

    def allows(self, value):
        if isinstance(value, float) and math.isnan(value):
            return False
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            return False
        if self.high is not None and (value > self.high or (self.high_open and value == self.high)):
            return False
        return True

    def describe(self):
        if self.low is not None and self.high is not None:
            left = "(" if self.low_open else "["
            right = ")" if self.high_open else "]"
            return f"a number in {left}{self.low}, {self.high}{right}"
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {self.low}"
        return f"{'<' if self.high_open else '<='} {self.high}"


class OneOf:
    """A fixed set of choices (strings or ints)."""

    def __init__(self, *choices):
        self.choices = choices

    def allows(self, value):
        return value in self.choices

    def describe(self):
        return "one of " + ", ".join(repr(c) for c in self.choices)


AT_LEAST_0 = Range(low=0)
AT_LEAST_1 = Range(low=1)
POSITIVE = Range(low=0, low_open=True)

RULES = {
    "nccl_comm_num": AT_LEAST_1,
    "hierarchical_allreduce_inter_nranks": AT_LEAST_1,
    "fuse_grad_size_in_MB": AT_LEAST_0,
    "fuse_grad_size_in_TFLOPS": AT_LEAST_0,
    "conv_workspace_size_limit": AT_LEAST_0,
    "last_comm_group_size_MB": AT_LEAST_0,
    "fuse_grad_size_in_num": AT_LEAST_1,
    "amp_configs.init_loss_scaling": POSITIVE,
    "amp_configs.incr_every_n_steps": AT_LEAST_1,
    "amp_configs.decr_every_n_nan_or_inf": AT_LEAST_1,
    "amp_configs.incr_ratio": Range(low=1, low_open=True),
    "amp_configs.decr_ratio": Range(low=0, high=1, low_open=True, high_open=True),
    "amp_configs.dtype": OneOf("float16", "bfloat16"),
    "gradient_merge_configs.k_steps": AT_LEAST_1,
    "localsgd_configs.k_steps": AT_LEAST_1,
    "localsgd_configs.begin_step": AT_LEAST_1,
    "adaptive_localsgd_configs.init_k_steps": AT_LEAST_1,
    "adaptive_localsgd_configs.begin_step": AT_LEAST_1,
    "dgc_configs.rampup_begin_step": AT_LEAST_0,
    "dgc_configs.rampup_step": AT_LEAST_1,
    "dgc_configs.sparsity": Range(low=0, high=1, high_open=True),
    "lars_configs.lars_coeff": POSITIVE,
    "lars_configs.lars_weight_decay": AT_LEAST_0,
    "lars_configs.epsilon": AT_LEAST_0,
    "lamb_configs.lamb_weight_decay": AT_LEAST_0,
    "build_strategy.reduce_strategy": OneOf(0, 1),
    "execution_strategy.num_threads": AT_LEAST_1,
    "execution_strategy.num_iteration_per_drop_scope": AT_LEAST_1,
    "execution_strategy.num_iteration_per_run": AT_LEAST_1,
    "gradient_scale_configs.scale_strategy": OneOf("avg", "sum", "customized"),
    "topk_configs.density": Range(low=0, high=1, low_open=True),
    "topk_configs.warmup_steps": AT_LEAST_0,
    "topk_configs.bisection_iterations": AT_LEAST_1,
    "topk_configs.min_numel": AT_LEAST_0,
    "pto_configs.partition": OneOf("size", "round_robin"),
    "pto_configs.allgather_bucket_MB": AT_LEAST_0,
    "data_configs.equal_batches": OneOf("pad", "drop", "error"),
    "data_configs.sampler": OneOf("distributed", "class_balanced", "pk"),
    "data_configs.pk_classes": AT_LEAST_1,
    "data_configs.pk_samples": AT_LEAST_1,
    "data_configs.cache_levels": OneOf("disk", "memory"),
    "data_configs.memory_cache_MB": AT_LEAST_0,
    "data_configs.loader": OneOf("paddle", "dali"),
    "hybrid_configs.dp_degree": Range(low=-1),
    **{f"hybrid_configs.{axis}_degree": AT_LEAST_0
       for axis in ("mp", "pp", "sharding", "sep", "ep", "moe_sharding", "cp", "cp_sharding")},
    "hybrid_configs.order": OneOf("dp", "pp", "sharding", "sep", "cp", "mp", "ep", "moe_sharding"),
    "hybrid_configs.mp_configs.sync_mode": OneOf("broadcast", "average"),
    "hybrid_configs.pp_configs.sync_mode": OneOf("broadcast", "average"),
    "hybrid_configs.sharding_configs.accumulate_steps": AT_LEAST_1,
    "hybrid_configs.sharding_configs.comm_buffer_size_MB": AT_LEAST_0,
}
