"""Benchmark: what `fleetrun --timeline` costs a training step.

    .venv/bin/python -m benchmarks.timeline.timeline_overhead [--rounds 3] [--epochs 2] [--json OUT]

Runs examples/train_digits.py (configs/cpu_gloo.yaml: one fused, copy-free bucket; 2 ranks)
through fleetrun with and without --timeline, alternating, --rounds times in this one run. Each
job's end-of-job step summary (log/step_summary.json) gives, per rank, the median step and the
mean host time before a step; a job's step cycle is the slowest rank's sum of the two, so what
the worker does between steps for the timeline (reading the stamps) counts too. The digits MLP's
step is a few milliseconds, so the stamps' fixed cost weighs more here than in any real model:
a worst case. Prints the table and {"ratio": median over rounds of cycle with / cycle without};
the target is <= 1.05.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB_TIMEOUT_S = 300
TARGET = 1.05


def job_cycle(folder, epochs, timeline):
    """The slowest rank's median step + mean host time (seconds) of one fleetrun job."""
    command = [sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2", "--log_dir", "log", "--quiet"]
    if timeline:
        command += ["--timeline", "trace.json"]
    command += [os.path.join(ROOT, "examples", "train_digits.py"), "--strategy",
                os.path.join(ROOT, "configs", "cpu_gloo.yaml"), "--epochs", str(epochs)]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("PADDLE_", "FLEETLITE_"))}
    result = subprocess.run(command, cwd=folder, env=environ, capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    if result.returncode != 0:
        sys.exit(f"the {'timeline' if timeline else 'plain'} job failed:\n{result.stderr[-3000:]}")
    with open(os.path.join(folder, "log", "step_summary.json")) as source:
        ranks = json.load(source)["ranks"]
    return max(rank["median_step_s"] + rank["mean_host_s"] for rank in ranks)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="digits epochs per job (22 steps each)")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for round_number in range(args.rounds):
            order = (False, True) if round_number % 2 == 0 else (True, False)
            cycles = {timeline: job_cycle(folder, args.epochs, timeline) for timeline in order}
            rows.append({"round": round_number, "plain_ms": cycles[False] * 1000, "timeline_ms": cycles[True] * 1000,
                         "ratio": cycles[True] / cycles[False]})
    print(f"digits MLP, 2 ranks, {args.epochs} epochs per job; step cycle = slowest rank's median step + host time")
    print("  round  plain (ms)  --timeline (ms)  ratio")
    for row in rows:
        print(f"  {row['round']:<5}  {row['plain_ms']:<10.2f}  {row['timeline_ms']:<15.2f}  {row['ratio']:.3f}")
    ratio = statistics.median(row["ratio"] for row in rows)
    print(f"ratios: timeline/plain = {ratio:.3f} (target <= {TARGET})")
    if args.json:
        with open(args.json, "w") as out:
            json.dump({"ratio": ratio, "target": TARGET, "rows": rows}, out, indent=1)


if __name__ == "__main__":
    main()
