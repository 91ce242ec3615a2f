"""adaptive_localsgd: local SGD whose period k follows the loss (Wang & Joshi, 2019), Fleet's `adaptive_localsgd`.

Gradients stay local (data_parallel is skipped) and the parameters are averaged as in
localsgd (its ParameterAverage: snapshot - mean(snapshot - p), one `pd_op.if` after the update),
on Fleet's rule with a k kept in a persistable value (init_k_steps at first) and last_sync
starting at 0:

  sync  <=>  step <= begin_step  or  step - last_sync == k

so with begin_step 1 the first syncs are at steps 1 and 1 + init_k_steps. Each sync also
all-reduces the loss of that step (the model's loss, before AMP's scaling): the first (step 1,
as begin_step >= 1) keeps its mean as loss_0 and the learning rate as lr_0 (Fleet's `initialize`
branch, which runs on step 1 too); a sync after begin_step sets

  k = clamp(ceil(sqrt(lr_0 * mean loss / (lr * loss_0) * init_k_steps)), 1, 16)

in float32 in Fleet's order of operations. So k shrinks as the loss falls (the ranks sync more
often near the optimum) and grows as the learning rate decays.
"""
import paddle

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compile.report import human_bytes
from fleetlite.compile.pass_contract import PassResult
from fleetlite.strategies.localsgd import (CONFLICTS, ParameterAverage, ParameterAveragingPass, at_most,
                                           checked_optimizer, equals, learning_rate, unique_name)

MIN_K, MAX_K = 1, 16


class AdaptiveLocalSgd(ParameterAveragingPass):
    name = "adaptive_localsgd"
    conflicts = CONFLICTS
    reads = ("adaptive_localsgd", "adaptive_localsgd_configs.init_k_steps", "adaptive_localsgd_configs.begin_step")

    def apply(self, context):
        checked_optimizer(context.optimizer, self.name)
        configs = self.strategy.adaptive_localsgd_configs
        init_k, begin = configs.init_k_steps, configs.begin_step
        lr = learning_rate(context.block)
        with program_edit.inserting(context.program, self.name, role=program_edit.OPTIMIZE):
            average = ParameterAverage(context, self.name)
            k = average.persistable("int64", [1], unique_name("adaptive_localsgd_k_steps"), init_k)
            last = average.persistable("int64", [1], unique_name("adaptive_localsgd_last_sync"), 0)
            loss_0 = average.persistable("float32", [1], unique_name("adaptive_localsgd_loss_0"), 0.0)
            lr_0 = average.persistable("float32", [1], unique_name("adaptive_localsgd_lr_0"), 0.0)
            step = average.step
            due = paddle.logical_or(at_most(step, begin), equals(paddle.subtract(step, last), k))

            def next_period():
                loss = paddle.reshape(paddle.cast(context.user_loss, "float32"), [1])
                mean_loss = paddle.scale(paddle._C_ops.all_reduce(loss, 0, gradient_buckets.SUM), 1.0 / average.world)
                first = equals(step, 1)
                new_loss_0 = paddle.where(first, mean_loss, loss_0)
                new_lr_0 = paddle.where(first, paddle.cast(paddle.reshape(lr, [1]), "float32"), lr_0)
                ratio = paddle.divide(paddle.multiply(new_lr_0, mean_loss),
                                      paddle.multiply(paddle.cast(paddle.reshape(lr, [1]), "float32"), new_loss_0))
                period = paddle.cast(paddle.ceil(paddle.sqrt(paddle.scale(ratio, float(init_k)))), "int64")
                period = paddle.maximum(paddle.minimum(period, paddle.full([1], MAX_K, "int64")),
                                        paddle.full([1], MIN_K, "int64"))
                return [paddle.where(at_most(step, begin), k, period), new_loss_0, new_lr_0]

            new_k, new_loss_0, new_lr_0 = average.build(due, next_period, (k, loss_0, lr_0))
            for new, old in ((new_k, k), (new_loss_0, loss_0), (new_lr_0, lr_0)):
                paddle.assign(new, output=old)
            paddle.assign(paddle.where(due, step, last), output=last)
        return PassResult(f"{len(average.params)} parameters averaged after the update on steps <= {begin}, then every "
                          f"k steps, k = clamp(ceil(sqrt(lr_0 * loss / (lr * loss_0) * {init_k})), {MIN_K}, {MAX_K}) "
                          f"({human_bytes(average.nbytes)} per sync)",
                          {"init_k_steps": init_k, "begin_step": begin, "bytes_per_sync": average.nbytes,
                           "k_steps_value": k.name})
