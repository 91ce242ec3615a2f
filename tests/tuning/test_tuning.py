"""The autotuner: its search as pure functions over recorded timings, the strategy writer, the
flags, and one real `fleetrun --tune` on 2 CPU ranks."""
import os
import re
import stat
import subprocess
import sys

import pytest

from fleetlite.errors import LaunchError
from fleetlite.launcher.spec import parse_launch_spec
from fleetlite.strategy.distributed_strategy import DistributedStrategy
from fleetlite.tuning import search, space, strategy_writer
from fleetlite.tuning.search import TrialResult, decide, next_trial, stop_early
from support.multiprocess import clean_environment, without_root_override

FUSE = space.Knob("fuse_grad_size_in_MB", (4, 16, 32))
RINGS = space.Knob("nccl_comm_num", (1, 2))
KNOBS = (FUSE, RINGS)
START = (("fuse_grad_size_in_MB", 32), ("nccl_comm_num", 1))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def config(fuse, rings=1):
    return (("fuse_grad_size_in_MB", fuse), ("nccl_comm_num", rings))


def trial(fuse, ms, rings=1, seconds=10.0, stopped=None):
    return TrialResult(config(fuse, rings), (ms,) * 5, None, seconds, stopped)


# --- the search --------------------------------------------------------------------------------
def test_the_first_trial_is_the_start_with_half_the_budget():
    assert next_trial(KNOBS, START, [], 100, 0) == search.NextTrial(START, 50, repeat=False)


@pytest.mark.parametrize("results, expected", [
    # each knob's values in order, every other knob at the best so far; the start is not rerun
    ([trial(32, 10)], config(4)),
    ([trial(32, 10), trial(4, 12)], config(16)),
    # 16 became the best: the next knob is tried on top of it
    ([trial(32, 10), trial(4, 12), trial(16, 8)], config(16, 2)),
    # coordinate descent goes on from the new best until every neighbour is tried
    ([trial(32, 10), trial(4, 12), trial(16, 8), trial(16, 7, rings=2)], config(4, 2)),
])
def test_the_sweep_tries_each_value_of_each_knob_around_the_best(results, expected):
    step = next_trial(KNOBS, START, results, 1000, 40)
    assert (step.config, step.repeat) == (expected, False)


def test_after_the_sweep_the_best_two_are_repeated_then_the_search_ends():
    swept = [trial(32, 10), trial(4, 12), trial(16, 8), trial(32, 11, rings=2), trial(16, 9, rings=2)]
    first = next_trial(KNOBS, START, swept, 1000, 50)
    assert (first.config, first.repeat) == (config(16), True)
    second = next_trial(KNOBS, START, swept + [trial(16, 8.2)], 1000, 60)
    assert (second.config, second.repeat) == (config(16, 2), True)
    assert next_trial(KNOBS, START, swept + [trial(16, 8.2), trial(16, 9.1, rings=2)], 1000, 70) is None


@pytest.mark.parametrize("spent, expected", [
    (50, (config(4), False, 30)),   # 50 s left: 2 repeats of 10 s are kept back, the sweep gets the rest
    (75, (config(32), True, 25)),   # 25 s left: no room for a sweep trial and both repeats
    (95, None),                     # 5 s left: not even the longest trial so far (10 s) fits
])
def test_budget_accounting_keeps_room_for_the_repeats(spent, expected):
    step = next_trial(KNOBS, START, [trial(32, 10), trial(16, 12)], 100, spent)
    assert (None if step is None else (step.config, step.repeat, step.allowance_s)) == expected


def test_a_stopped_or_failed_trial_is_never_ranked_nor_retried():
    results = [trial(32, 10), trial(4, 2, stopped="failed with exit code 1")]
    assert search.ranking(results) == [config(32)]
    assert next_trial(KNOBS, START, results, 1000, 0).config == config(16)


@pytest.mark.parametrize("steps, best, expected", [
    ((20.0, 20.0), 10.0, None),              # too few steps to judge
    ((20.0, 20.0, 20.0), 10.0, "over"),      # median 2x the best
    ((12.4, 12.4, 30.0), 10.0, None),        # median within 1.25x
    ((13.0, 12.6, 12.6), 10.0, "over"),      # median 1.26x
    ((99.0, 99.0, 99.0), None, None),        # nothing to compare with yet (the start's trial)
])
def test_stop_early(steps, best, expected):
    reason = stop_early(steps, best)
    assert (reason if reason is None else "over") == expected


@pytest.mark.parametrize("results, winner, kept, noise", [
    # clearly faster, quiet repeats: picked
    ([trial(32, 10), trial(16, 8), trial(16, 8.3), trial(32, 10.1)], config(16), False, 0.3 / 8.15),
    # 5 % faster but its two runs differ by 10.5 %: within noise, the start is kept
    ([trial(32, 10), trial(16, 9), trial(16, 10), trial(32, 10)], config(32), True, 1 / 9.5),
    # 1 % faster with quiet repeats: below the 2 % floor, kept
    ([trial(32, 10), trial(16, 9.9), trial(16, 9.9), trial(32, 10)], config(32), True, 0.02),
    # the start is the fastest
    ([trial(32, 8), trial(16, 9), trial(32, 8), trial(16, 9)], config(32), True, 0.02),
])
def test_decide_picks_the_best_only_beyond_the_noise(results, winner, kept, noise):
    decision = decide(START, results)
    assert (decision.winner, decision.kept_start) == (winner, kept)
    assert decision.noise == pytest.approx(noise) and decision.repeated == 2
    if kept and decision.winner_ms < decision.start_ms:
        assert "within the noise" in decision.reason


def test_decide_needs_a_complete_start():
    with pytest.raises(ValueError, match="starting strategy"):
        decide(START, [trial(16, 8), trial(32, 10, stopped="out of time")])


@pytest.mark.parametrize("job, searched", [
    (space.JobShape("cpu", 1, 1), ["fuse_grad_size_in_MB"]),
    (space.JobShape("cpu", 2, 1), ["fuse_grad_size_in_MB", "pto"]),
    (space.JobShape("cpu", 4, 2), ["fuse_grad_size_in_MB", "use_hierarchical_allreduce", "pto"]),
    (space.JobShape("gpu", 16, 2), ["fuse_grad_size_in_MB", "nccl_comm_num", "use_hierarchical_allreduce",
                                    "fp16_allreduce", "pto"]),
    # top-k's density only where the user chose top-k: the tuner never turns a lossy exchange on
    (space.JobShape("cpu", 2, 1, frozenset({"topk"})), ["fuse_grad_size_in_MB", "pto", "topk_configs.density"]),
])
def test_the_space_keeps_only_knobs_that_can_matter_on_the_job(job, searched):
    kept, skipped = space.searched_knobs(job)
    assert [k.field for k in kept] == searched
    assert len(kept) + len(skipped) == len(space.KNOBS) and all(why for _, why in skipped)


def test_cpu_jobs_search_the_larger_buckets_that_copy_free_syncs_favour():
    fuse = {job.device: next(k for k in space.searched_knobs(job)[0] if k.field == "fuse_grad_size_in_MB").values
            for job in (space.JobShape("cpu", 2, 1), space.JobShape("gpu", 16, 2))}
    assert fuse == {"cpu": (4, 16, 32, 64, 128), "gpu": (1, 2, 4, 8, 16, 32, 64)}


# --- writing the winner ------------------------------------------------------------------------
YAML_TEXT = """# fleetlite 0.1.0 DistributedStrategy
# my notes on this job
fuse_all_reduce_ops: true
fuse_grad_size_in_MB: 32   # Fleet's default
amp: false
"""


def test_yaml_keeps_comments_and_other_fields_and_replaces_the_previous_table(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(YAML_TEXT)
    strategy_writer.write_winner(path, (("fuse_grad_size_in_MB", 16), ("fp16_allreduce", True)), ["run one"])
    strategy_writer.write_winner(path, (("fuse_grad_size_in_MB", 8), ("topk_configs.density", 0.1)),
                                 ["run two", "second line"])
    text = path.read_text()
    assert text.startswith("# fleetlite 0.1.0 DistributedStrategy\n# my notes on this job\n")
    assert re.search(r"^fuse_grad_size_in_MB: 8 +# Fleet's default$", text, re.M)   # the comment keeps its column
    assert re.findall(r"^#\|.*$", text, re.M) == ["#| run two", "#| second line"]
    loaded = DistributedStrategy.load(path).validate()
    assert (loaded.fuse_grad_size_in_MB, loaded.fp16_allreduce, loaded.amp) == (8, True, False)
    assert loaded.topk_configs.density == pytest.approx(0.1)


def test_prototxt_gets_the_winner_and_the_table(tmp_path):
    path = tmp_path / "s.prototxt"
    start = DistributedStrategy()
    start.nccl_comm_num = 2
    start.save(path)
    strategy_writer.write_winner(path, (("fuse_grad_size_in_MB", 4),), ["trial table"])
    assert path.read_text().endswith("#| trial table\n")
    loaded = DistributedStrategy.load(path)
    assert (loaded.fuse_grad_size_in_MB, loaded.nccl_comm_num) == (4, 2)


def test_a_winner_the_schema_rejects_leaves_the_file_untouched(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(YAML_TEXT)
    with pytest.raises(Exception, match="fuse_grad_size_in_MB"):
        strategy_writer.write_winner(path, (("fuse_grad_size_in_MB", "big"),), ["table"])
    assert path.read_text() == YAML_TEXT and os.listdir(tmp_path) == ["s.yaml"]


def test_the_winner_keeps_the_file_mode_and_a_read_only_file_is_refused_even_for_root(tmp_path):
    """Root may write any file; the tuner still respects a file its owner made read-only (0444)."""
    path = tmp_path / "s.yaml"
    path.write_text(YAML_TEXT)
    path.chmod(0o640)
    strategy_writer.write_winner(path, (("fuse_grad_size_in_MB", 16),), ["table"])
    assert (stat.S_IMODE(path.stat().st_mode), DistributedStrategy.load(path).fuse_grad_size_in_MB) == (0o640, 16)
    path.write_text(YAML_TEXT)
    path.chmod(0o444)
    message = (f"--strategy_file {path}: the file is read-only (mode 0444), so the tuner could not write the "
               f"winner into it: make it writable, or tune a writable copy")
    for attempt in (strategy_writer.check_writable,
                    lambda p: strategy_writer.write_winner(p, (("fuse_grad_size_in_MB", 8),), ["table"])):
        with pytest.raises(LaunchError, match=f"^{re.escape(message)}$"):
            attempt(path)
    assert (path.read_text(), stat.S_IMODE(path.stat().st_mode)) == (YAML_TEXT, 0o444)
    assert os.listdir(tmp_path) == ["s.yaml"]


# --- flags ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv, message", [
    (["--budget", "30", "train.py"], "--budget only applies with --tune"),
    (["--tune", "train.py"], "--tune needs --strategy_file"),
    (["--tune", "--strategy_file", "s.yaml", "--budget", "0", "train.py"], "positive number of seconds"),
])
def test_bad_tune_flags_are_named(argv, message):
    with pytest.raises(LaunchError, match=re.escape(message)):
        parse_launch_spec(argv, {})


def test_tune_flags_reach_the_spec():
    spec = parse_launch_spec(["--tune", "--strategy_file", "s.yaml", "--budget", "30", "--tune_steps", "5",
                              "--nproc_per_node", "2", "train.py", "--budget", "7"], {})
    assert (spec.tune.strategy_file, spec.tune.budget_s, spec.tune.steps, spec.nproc_per_node) == \
        ("s.yaml", 30, 5, 2)
    assert spec.script_args == ("--budget", "7")   # the script's own flags stay the script's


# --- end to end ----------------------------------------------------------------------------------
def test_fleetlite_tune_on_two_cpu_ranks_writes_a_valid_strategy(tmp_path):
    path = tmp_path / "strategy.yaml"
    path.write_text(open(os.path.join(ROOT, "configs", "cpu_gloo.yaml")).read())
    comments = [line for line in path.read_text().splitlines() if line.startswith("#")]
    result = subprocess.run(
        [sys.executable, "-m", "fleetlite.cli", "tune", "--strategy_file", str(path), "--budget", "45",
         "--tune_steps", "5", "--tune_warmup", "2", "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"),
         os.path.join(ROOT, "examples", "train_digits.py"), "--strategy", str(path), "--epochs", "1000"],
        cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=90)
    assert result.returncode == 0, result.stderr[-3000:]
    text = path.read_text()
    assert [line for line in text.splitlines() if line.startswith("#") and not line.startswith("#|")] == comments
    rows = [re.split(r" {2,}", line[3:]) for line in text.splitlines() if re.match(r"#\| \d", line)]
    preset = DistributedStrategy.load(os.path.join(ROOT, "configs", "cpu_gloo.yaml")).fuse_grad_size_in_MB
    assert rows[0][:2] == ["1", f"start: fuse_grad_size_in_MB={preset}, pto=False"] and len(rows) >= 2
    step_ms, sync_ms = float(rows[0][2]), float(rows[0][4])   # the start's trial measured both
    assert step_ms > 0 and abs(sync_ms) < 10 * step_ms
    strategy = DistributedStrategy.load(path).validate()
    verdict = re.search(r"^#\| (?:winner: (.+?), [\d.]+ ms/step|kept the starting strategy)", text, re.M)
    assert verdict, text
    changed = dict(pair.split("=") for pair in verdict.group(1).split(", ")) if verdict.group(1) else {}
    assert set(changed) <= {"fuse_grad_size_in_MB", "pto"}
    assert strategy.fuse_grad_size_in_MB == int(changed.get("fuse_grad_size_in_MB", preset))
    assert strategy.pto == (changed.get("pto") == "True")
    assert re.search(r"spread between repeats \(noise\)|no config ran twice", result.stderr)


def folder_contents(folder):
    return sorted((str(path.relative_to(folder)), path.is_dir() or path.read_bytes())
                  for path in folder.rglob("*"))


OUT_OF_RANGE = "is out of range: the search needs a finite, positive number of seconds (e.g. --budget 120)"
NOT_WRITABLE = "make it writable, or tune a writable copy"
FLEETRUN_TUNE = ["-m", "fleetlite.launcher", "--tune"]
FLEETLITE_TUNE = ["-m", "fleetlite.cli", "tune"]


@pytest.mark.parametrize("entry, argv, message", [
    (FLEETRUN_TUNE, ["--explain"], "--tune and --explain cannot be used together: --explain prints the "
                                   "compile report and trains nothing, --tune times trials; run one, then the other"),
    (FLEETLITE_TUNE, ["--explain"], "--tune and --explain cannot be used together: --explain prints the "
                                    "compile report and trains nothing, --tune times trials; run one, then the other"),
    (FLEETLITE_TUNE, ["--budget", "nan"], f"--budget nan {OUT_OF_RANGE}"),
    (FLEETRUN_TUNE, ["--budget", "inf"], f"--budget inf {OUT_OF_RANGE}"),
    (FLEETLITE_TUNE, ["--budget=-inf"], f"--budget -inf {OUT_OF_RANGE}"),
    (FLEETLITE_TUNE, ["--budget", "1e999"], f"--budget inf {OUT_OF_RANGE}"),
    (FLEETLITE_TUNE, ["--budget", "0"], f"--budget 0 {OUT_OF_RANGE}"),
    (FLEETRUN_TUNE, ["--budget", "-30"], f"--budget -30 {OUT_OF_RANGE}"),
    # the write-back target, checked before the search spends the budget
    (FLEETLITE_TUNE, ["--strategy_file", "blocked/s.yaml"],
     f"--strategy_file blocked/s.yaml: the tuner could not write the winner next to it (Is a directory: "
     f"blocked/.s.yaml.tuned.yaml): {NOT_WRITABLE}"),
    pytest.param(FLEETLITE_TUNE, ["--strategy_file", "read-only-file/s.yaml"],
                 f"--strategy_file read-only-file/s.yaml: the file is read-only (mode 0444), so the tuner could not write "
                 f"the winner into it: {NOT_WRITABLE}"),
    pytest.param(FLEETRUN_TUNE, ["--strategy_file", "read-only-folder/s.yaml"],
                 f"--strategy_file read-only-folder/s.yaml: the tuner could not write the winner next to it "
                 f"(Permission denied: read-only-folder/.s.yaml.tuned.yaml): {NOT_WRITABLE}"),
    # the launch's own pre-start checks, made before the first trial
    (FLEETLITE_TUNE, ["--log_dir", "train.py"], "--log_dir train.py: train.py is a file, not a folder: move it "
                                                "away, or pass another --log_dir"),
    (FLEETRUN_TUNE, ["--ips", "10.0.0"], "--ips: host 1 '10.0.0' is not a valid IPv4 address: write four "
                                         "numbers 0-255 without leading zeros, like 10.0.0.1"),
])
def test_tune_refuses_bad_input_before_the_search(tmp_path, entry, argv, message):
    for folder in ("writable", "blocked", "read-only-file", "read-only-folder"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s.yaml").write_text(YAML_TEXT)
    (tmp_path / "blocked" / ".s.yaml.tuned.yaml").mkdir()
    (tmp_path / "read-only-file" / "s.yaml").chmod(0o444)
    (tmp_path / "read-only-folder").chmod(0o555)
    (tmp_path / "train.py").write_text("raise SystemExit(0)\n")
    before = folder_contents(tmp_path)
    result = subprocess.run([*without_root_override(), sys.executable, *entry, "--strategy_file", "writable/s.yaml", "--budget", "20",
                             *argv, "train.py"], cwd=tmp_path, env=clean_environment(), capture_output=True,
                            text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"fleetrun: error: {message}\n")
    assert folder_contents(tmp_path) == before     # no trial ran, no log folder, the strategy untouched


@pytest.mark.parametrize("argv", [
    ["--tune", "--strategy_file", "s.yaml", "--ips", "127.0.0.1,127.0.0.2", "train.py"],
    ["--tune", "--strategy_file", "s.yaml", "--ssh", "--ips", "127.0.0.1,127.0.0.2", "train.py"],
])
def test_tuning_several_hosts_is_refused_with_the_reason(argv):
    from fleetlite.tuning.trials import check_tunable
    with pytest.raises(LaunchError, match="one-host job"):
        check_tunable(parse_launch_spec(argv, {}))
