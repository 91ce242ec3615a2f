"""Static-program parity jobs: a worker trains every case on its rank's rows beside a
one-process reference on the full batch and writes OUT/result.<rank>.json; the test runs it
through the real launcher and holds each rank to the reference."""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from support.multiprocess import clean_environment


def run_through_fleetrun(worker, out, world=2, timeout=150):
    """[each rank's results] of one `fleetlite run --nproc_per_node world worker out` job."""
    run = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", "--nproc_per_node", str(world),
                          "--log_dir", str(out / "log"), str(worker), str(out)],
                         cwd=out, env=clean_environment(), capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"result.{rank}.json").read_text()) for rank in range(world)]


def assert_ranks_equal_the_reference(results, tolerance, applied):
    """The mean of the ranks' losses and every rank's parameters equal the reference's, the
    parameters moved, and the pass `applied` ran."""
    mean_loss = np.mean([result["losses"] for result in results], axis=0)
    np.testing.assert_allclose(mean_loss, results[0]["reference_losses"], rtol=0, atol=tolerance)
    for rank, result in enumerate(results):
        assert result["param_diff"] <= tolerance, f"rank {rank}: parameters {result['param_diff']} off"
        assert result["moved"] > 0.01, "the parameters barely moved: the comparison would prove nothing"
        assert applied in result["applied"]


def write_rank_results(compare, cases, rows):
    """Worker side: in static mode after fleet.init, {case: compare(case, x, y)} on `rows`
    digits, written to OUT/result.<rank>.json (OUT is the worker's first argument)."""
    import paddle
    import fleetlite as fleet
    from support import models
    paddle.enable_static()
    fleet.init(is_collective=True)
    x, y = models.digits(rows)
    results = {case: compare(case, x, y) for case in cases}
    (Path(sys.argv[1]) / f"result.{fleet.worker_index()}.json").write_text(json.dumps(results))
