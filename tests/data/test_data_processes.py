"""Through fleetrun, 2 ranks on deliberately uneven data: every equal_batches policy finishes
(a rank with a batch fewer would hang in the next gradient all-reduce), "error" fails fast
naming the sizes, and a 2-rank evaluation equals the 1-process one exactly."""
import json
import os

import pytest

from fleetlite.data.write_records import main as write_records
from support.multiprocess import SCRIPTS, fleetrun

TRAIN = os.path.join(SCRIPTS, "train_uneven_data.py")


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    folder = tmp_path_factory.mktemp("records")
    assert write_records([str(folder), "--digits", "--shards", "3"]) == 0
    return str(folder / "*.tar")


def test_pad_and_drop_keep_uneven_ranks_in_step_and_evaluation_equals_one_process(tmp_path, records):
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "uneven", TRAIN, "--records", records,
                       "--policies", "pad,drop", "--out", str(tmp_path)], tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in range(2)]
    # rank 0 holds 1198 records, rank 1 599; the 1797 digits split 899/898 after padding one or dropping one
    assert ranks[0]["steps"] == {"pad/records": [75, 0, 0], "pad/digits": [57, 1, 0],
                                 "drop/records": [38, 0, 599], "drop/digits": [57, 0, 1]}
    assert ranks[1]["steps"] == {"pad/records": [75, 599, 0], "pad/digits": [57, 1, 0],
                                 "drop/records": [38, 0, 0], "drop/digits": [57, 0, 1]}
    assert [r["own"] for r in ranks] == [898, 899]                      # each digit once, no padding
    assert ranks[0]["seen"] == ranks[1]["seen"] == 1797
    assert ranks[0]["correct"] == ranks[1]["correct"] == ranks[0]["one_process_correct"]


def test_the_error_policy_stops_the_job_at_once_naming_the_sizes(tmp_path, records):
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "uneven-error", TRAIN, "--records", records,
                       "--policies", "error", "--out", str(tmp_path)], tmp_path, timeout=240)
    assert result.returncode != 0 and "job failed" in result.stderr   # both ranks raise; either is the root cause
    assert ("equal_batches='error': the ranks hold different numbers of samples (rank 0: 1198, rank 1: 599)"
            in result.stdout + result.stderr)
