"""The main of the exchange workers (topk, dgc): every case of argv[1], a JSON {name: strategy
fields}, trained in turn by `train(fields, x, y)` on this job's digits, and the results handed
back to the test. The program-order flag a case's report sets is reset before the next case."""
import json
import sys

import paddle

import fleetlite as fleet
from fleetlite.compression.sparse_exchange import IN_ORDER
from support.multiprocess import write_result
from support import models


def train_each_case(train, rows_per_rank):
    cases = json.loads(sys.argv[1])
    paddle.enable_static()
    fleet.init(is_collective=True)
    x_all, y_all = models.digits(fleet.worker_num() * rows_per_rank)
    defaults = paddle.get_flags([IN_ORDER])
    results = {}
    for name, fields in cases.items():
        results[name] = train(fields, x_all, y_all)
        paddle.set_flags(defaults)
    write_result(results)
