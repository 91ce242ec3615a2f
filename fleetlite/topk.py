"""`fleetlite.compression.topk_select`: the public name of fleetlite's top-k selection (MSTopK, and exact top-k as
its reference). The selection itself lives in `fleetlite/compression/topk_select.py`; the
exchange that uses it is the `topk` pass, `strategies/topk_exchange.py`."""
from fleetlite.compression.topk_select import exact_topk, mstopk, tensor_over

__all__ = ["exact_topk", "mstopk", "tensor_over"]
