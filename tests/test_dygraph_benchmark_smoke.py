"""benchmarks/dygraph_step.py still runs end to end (one round, no timing asserted)."""
from test_benchmarks_smoke import run_driver


def test_dygraph_step_driver_reports_both_ratios_and_the_first_call_time(tmp_path):
    result, report = run_driver(tmp_path, "dygraph_step.py", "--rounds", "1", "--warmup", "0", "--reps", "1")
    assert [row["model"] for row in report["rows"]] == ["mlp", "conv"]
    assert all(report["ratios"][f"R_{model}"] > 0 and report["ratios"][f"first_call_ms_{model}"] > 0
               for model in ("mlp", "conv"))
    assert "ratios:" in result.stdout
