"""One numerics job for the session: the AMP, fp16_allreduce and sync_batch_norm tests each name
their scenarios in NUMERICS_SCENARIOS, and every selected module's scenarios train together in
one 1-process oracle and one 2-rank job of workers/numerics_worker.py, side by side (each job
costs Paddle's import and a rendezvous; three modules used to pay them three times)."""
import json
from pathlib import Path

import pytest

from support.multiprocess import run_with_oracles

NUMERICS_WORKER = Path(__file__).resolve().parents[1] / "workers" / "numerics_worker.py"
NUMERICS_WORLD = 2
# both jobs run at once and finish before pytest-timeout's default 300 s for the first test
NUMERICS_TIMEOUT_S = 270


@pytest.fixture(scope="session")
def numerics(request):
    """(the oracle's {scenario: result}, [each rank's {scenario: result}]) of every scenario named by
    a module with a selected test."""
    scenarios = {}
    for module in {getattr(item, "module", None) for item in request.session.items} - {None}:
        for name, scenario in getattr(module, "NUMERICS_SCENARIOS", {}).items():
            assert scenarios.setdefault(name, scenario) == scenario, f"two modules define scenario {name} differently"
    return run_with_oracles(NUMERICS_WORKER, {NUMERICS_WORLD: 1}, lambda world: [world, json.dumps(scenarios)],
                            NUMERICS_TIMEOUT_S)[NUMERICS_WORLD]
