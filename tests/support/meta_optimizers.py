"""The optimizer Fleet's LARS and LAMB meta-optimizers train with, built from the inner optimizer
exactly as paddle/distributed/fleet/meta_optimizers/{lars,lamb}_optimizer.py build it: the
one-process reference the lars and lamb passes must equal."""
import paddle
from paddle.incubate.optimizer import LarsMomentumOptimizer


def fleet_optimizer(inner, fields):
    """LarsMomentumOptimizer (lars) or Lamb (lamb) in place of `inner`, from the strategy `fields`;
    `inner` itself when neither is on."""
    if fields.get("lars"):
        configs = {"lars_coeff": 0.001, "lars_weight_decay": 0.0005, "epsilon": 0.0,
                   "exclude_from_weight_decay": [], **fields.get("lars_configs", {})}
        return LarsMomentumOptimizer(learning_rate=inner._learning_rate, momentum=inner._momentum,
                                     parameter_list=inner._parameter_list, regularization=inner.regularization,
                                     grad_clip=inner._grad_clip, **configs)
    if fields.get("lamb"):
        configs = {"lamb_weight_decay": 0.01, "exclude_from_weight_decay": [], **fields.get("lamb_configs", {})}
        suffixes = configs["exclude_from_weight_decay"]
        excluded = (lambda param: any(param.name.endswith(s) for s in suffixes)) if suffixes else None
        return paddle.optimizer.Lamb(learning_rate=inner._learning_rate, lamb_weight_decay=configs["lamb_weight_decay"],
                                     beta1=inner._beta1, beta2=inner._beta2, epsilon=inner._epsilon,
                                     parameters=inner._parameter_list, grad_clip=inner._grad_clip,
                                     exclude_from_weight_decay_fn=excluded)
    return inner
