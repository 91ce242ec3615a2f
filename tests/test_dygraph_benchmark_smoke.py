"""benchmarks/dygraph_step.py still runs end to end (one round, the MLP only: the conv net differs
only in the model it builds; no timing asserted)."""
from test_benchmarks_smoke import run_driver


def test_dygraph_step_driver_reports_both_ratios_and_the_first_call_time(tmp_path):
    result, report = run_driver(tmp_path, "dygraph_step.py", "--models", "mlp", "--rounds", "1", "--warmup", "0",
                                "--reps", "1")
    assert [row["model"] for row in report["rows"]] == ["mlp"]
    assert report["ratios"]["R_mlp"] > 0 and report["ratios"]["first_call_ms_mlp"] > 0
    assert "ratios:" in result.stdout
