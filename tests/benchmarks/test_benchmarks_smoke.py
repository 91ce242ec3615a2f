"""The benchmark drivers still run end to end (one round, no timing asserted: speed targets
live in the benchmarks' own ratios, never in tests)."""
import json
import subprocess
import sys
from pathlib import Path

import paddle

ROOT = Path(__file__).resolve().parents[2]


def run_driver(tmp_path, module, *args, timeout=240):
    """(the finished process, its --json report) of one benchmark driver run (`python -m module` from
    the repository root, as `make bench` runs it), which must exit 0."""
    out = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", module, *args, "--json", str(out)], cwd=ROOT,
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-2000:]
    return result, json.loads(out.read_text())


def test_gradsync_driver_runs_its_contenders_and_reports_ratios(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.gradsync.gradsync", "--only", "paddle_flat_limit",
                                "fleetlite_cpu_preset",
                                "--rounds", "1", "--warmup", "0", "--reps", "1")
    assert [row["contender"] for row in report["rows"]] == ["paddle_flat_limit", "fleetlite_cpu_preset"]
    assert all(row["median_ms"] > 0 for row in report["rows"])
    assert report["ratios"]["best_copy_free"] == "fleetlite_cpu_preset"
    in_place, members = map(int, report["rows"][1]["in_place"].split("/"))
    assert members > 0 and in_place >= members - 161     # the first step copies, the rest find them in place
    assert "ratios:" in result.stdout


def test_data_loading_driver_runs_its_contenders_and_reports_ratios(tmp_path):
    _, report = run_driver(tmp_path, "benchmarks.data.data_loading", "--samples", "20000", "--records", "800",
                           "--rounds", "1", "--warmup", "0", "--reps", "1")
    assert len(report["rows"]) == 8 and all(row["median_ms"] > 0 for row in report["rows"])
    assert {"sampler_fleetlite_vs_paddle", "records_shard_of_2_vs_whole"} <= set(report["ratios"])


def test_data_cache_driver_runs_quick_and_reports_every_key(tmp_path):
    _, report = run_driver(tmp_path, "benchmarks.data.data_cache", "--quick", timeout=300)
    assert {"uncached_epoch_s", "epoch1_s", "epoch2_s", "page_cache_epoch_s", "stall_fraction",
            "resident_bytes_per_node", "sizes", "decode_images_per_s", "with_augmentation", "with_dali_augmentation",
            "load_average_1_5_15_min"} <= set(report)
    assert report["with_dali_augmentation"]["cached_epoch_s"] > 0
    for first in report["hits_misses"]["epoch1"]:   # a rank reading ahead may decode a sample the other needs
        assert first["memory_misses"] + first.get("memory_hits", 0) == 12
        assert first["memory_misses"] == first["disk_misses"] + first.get("disk_hits", 0)
    assert report["hits_misses"]["last_cached_epoch"] == [{"memory_hits": 12}] * 2
    assert report["resident_bytes_per_node"] >= 24 * report["sizes"]["decoded_bytes_per_sample"]


def test_amp_bf16_driver_measures_where_the_cpu_has_bfloat16_and_says_why_not_elsewhere(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.amp.amp_bf16", "--rounds", "1", "--warmup", "0", "--reps", "1",
                                timeout=480)
    if not paddle.base.core.supports_bfloat16():
        assert result.stdout.startswith("skipped: this CPU has no AVX512-BF16")
        assert report == {"skipped": result.stdout[len("skipped: "):].strip()}
        return
    assert [row["model"] for row in report["rows"]] == ["convnet", "mlp"]
    assert all(row["fp32"] > 0 and row["bf16"] > 0 for row in report["rows"])
    assert set(report["ratios"]) == {"S_convnet", "S_mlp"}


def test_topk_select_driver_runs_its_contenders_and_reports_ratios(tmp_path):
    _, report = run_driver(tmp_path, "benchmarks.topk.topk_select", "--sizes", "0.05", "--densities", "0.01",
                           "--rounds", "1", "--warmup", "0")
    (row,) = report["rows"]
    assert row["k"] == 500 and row["recall"] == 1.0
    assert all(row[name] > 0 for name in ("mstopk_static", "mstopk_eager", "numpy_argpartition", "stream"))
    assert "numpy_argpartition_over_mstopk" in report["ratios"]


def test_pto_driver_runs_its_contenders_and_reports_update_times_and_state_bytes(tmp_path):
    _, report = run_driver(tmp_path, "benchmarks.pto.pto", "--models", "small_params", "--rounds", "1", "--warmup", "0",
                           "--reps", "1")
    ratios = report["ratios"]["small_params"]
    assert ratios["update_ms_one_rank"] > 0 and ratios["update_ms_pto"] > 0
    assert 0 < ratios["optimizer_state_bytes_per_rank"] < ratios["optimizer_state_bytes_unsharded"]
    assert ratios["model"] == "small_params"


def test_topk_wire_bytes_driver_counts_what_the_formula_predicts_or_says_why_it_cannot(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.topk.topk_wire_bytes", "--exchanges", "dense", "topk_0.01",
                                "localsgd_2", "--layers", "64,512,10", "--rounds", "1", "--warmup", "1", "--steps", "2")
    if "skipped" in report:     # not root, or no iproute2: the reason is printed, nothing measured
        assert result.stdout.startswith("skipped: ") and report["skipped"]
        return
    dense, sparse, local = report["rows"]
    assert 1.0 <= dense["measured_over_predicted"] < 1.05      # gloo's ring all-reduce plus TCP framing
    assert sparse["bytes_per_step"] < dense["bytes_per_step"] / 5
    # 2 ranks: ceil(0.01 n) (value, index) pairs of 32768 and 5120 weights; 522 bias elements dense
    assert sparse["predicted"] == 2 * ((328 + 52) * 8 + (512 + 10) * 4)
    assert local["predicted"] == dense["predicted"] / 2 and 1.0 <= local["measured_over_predicted"] < 1.05


def test_two_node_steps_driver_times_a_two_level_exchange_beside_its_flat_form_or_says_why_it_cannot(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.multihost.two_node_steps", "--pairs", "hierarchical_topk",
                                "--layers", "64,128,10", "--rate", "100mbit", "--rounds", "1", "--warmup", "0",
                                "--reps", "1")
    if "skipped" in report:     # not root, no iproute2 or openssh: the reason is printed, nothing measured
        assert result.stdout.startswith("skipped: ") and report["skipped"]
        return
    assert [row["exchange"] for row in report["rows"]] == ["topk", "hierarchical_topk"]
    assert all(row["median_ms"] > 0 for row in report["rows"])
    assert set(report["ratios"]) == {"hierarchical_topk_over_topk"}


def test_dygraph_step_driver_reports_both_ratios_and_the_first_call_time(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.dygraph.dygraph_step", "--models", "mlp", "--rounds", "1", "--warmup", "0",
                                "--reps", "1")
    assert [row["model"] for row in report["rows"]] == ["mlp"]
    assert report["ratios"]["R_mlp"] > 0 and report["ratios"]["first_call_ms_mlp"] > 0
    assert "ratios:" in result.stdout


def test_timeline_overhead_driver_times_jobs_with_and_without_the_timeline(tmp_path):
    result, report = run_driver(tmp_path, "benchmarks.timeline.timeline_overhead", "--rounds", "1", "--epochs", "1",
                                timeout=300)
    (row,) = report["rows"]
    assert row["plain_ms"] > 0 and row["timeline_ms"] > 0 and report["ratio"] == row["ratio"]
    assert "ratios: timeline/plain = " in result.stdout
