"""Benchmark: fleetlite under a real Slurm and a real Open MPI on the namespace cluster.

    .venv/bin/python -m benchmarks.multihost.schedulers [--json out.json]

Needs root, iproute2, Debian's slurmctld, slurmd, munge and openmpi-bin (installed when missing;
where they cannot be, it says why and exits cleanly). On 2 hosts x 2 ranks
(benchmarks/harness/slurm_cluster.py), tests/launcher_scripts/train_linear.py with fleet.init:
- parity_max_rel: the largest relative difference of the final weights from one process's on the
  full batch (`srun -N 2 --ntasks-per-node 2`, and `mpirun -np 4 -H node-a:2,node-b:2` over ssh);
- rank_kill_detect_s: rank 2 (node-b) SIGKILLed at its step 2; seconds until the job has ended;
- rank_named: whether every survivor's output says `rank 2 on node-b is gone`;
- orphans: the job's processes still running on any host 10 s after its end;
- Slurm only: sbatch_ok (examples/slurm/train_digits.sbatch trains to its end) and
  fleetrun_in_allocation_ok (`salloc ... fleetrun` fans out over both hosts and matches one process).
Writes {"slurm": {...}, "mpirun": {...}}.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.harness import slurm_cluster
from benchmarks.harness.runner import publish_skipped

ROOT = Path(__file__).resolve().parents[2]
TRAIN = str(ROOT / "tests" / "launcher_scripts" / "train_linear.py")
HOSTS, PER_HOST, STEPS, KILLED_RANK = 2, 2, 6, 2
JOB_TIMEOUT_S, LEFT_WITHIN_S = 300, 10
MASTER = "node-a:29500"
QUIET = {"OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2", "PYTHONWARNINGS": "ignore"}


def environment():
    kept = {name: value for name, value in os.environ.items() if not name.startswith(("PADDLE_", "FLEETLITE_"))}
    return {**kept, **QUIET, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}


def train(*args):
    return [sys.executable, TRAIN, "--fleet", *args]


def max_relative(weights_file, reference):
    return float(np.max(np.abs(np.load(weights_file) - reference) / np.maximum(np.abs(reference), 1e-12)))


def killed_rank_figures(slurm, argv, cwd):
    seconds, output = slurm.kill_rank_during(argv, cwd, environment(), KILLED_RANK, timeout=JOB_TIMEOUT_S)
    survivors = [rank for rank in range(HOSTS * PER_HOST) if rank != KILLED_RANK]
    named = [f"rank {KILLED_RANK} on node-b is gone: stopping rank {rank} too" in output for rank in survivors]
    return {"rank_kill_detect_s": round(seconds, 2), "rank_named": all(named),
            "survivors_naming_it": sum(named), "orphans": len(slurm.left_running(TRAIN, LEFT_WITHIN_S))}


def slurm_figures(slurm, folder, reference):
    srun = ["srun", "-N", str(HOSTS), "--ntasks-per-node", str(PER_HOST)]
    parity = slurm.run(srun + train("--steps", str(STEPS), "--out", "w.npy"), JOB_TIMEOUT_S,
                       cwd=folder / "srun", env=environment())
    figures = {"parity_max_rel": max_relative(folder / "srun" / "w.npy", reference) if parity.returncode == 0 else None}
    figures.update(killed_rank_figures(slurm, srun + train("--steps", "300", "--step_seconds", "0.2"), folder / "kill"))
    for name in ("examples", "configs"):
        shutil.copytree(ROOT / name, folder / "sbatch" / name)
    sbatch = slurm.run(["sbatch", "--wait", "examples/slurm/train_digits.sbatch"], JOB_TIMEOUT_S,
                       cwd=folder / "sbatch", env=environment())
    logs = "".join(log.read_text() for log in (folder / "sbatch").glob("fleetlite-digits-*.out"))
    figures["sbatch_ok"] = sbatch.returncode == 0 and "test accuracy" in logs
    allocation = slurm.run(["salloc", "-N", str(HOSTS), "--ntasks-per-node", str(PER_HOST), sys.executable, "-m",
                            "fleetlite.launcher", TRAIN, "--steps", str(STEPS), "--out", "w.npy"], JOB_TIMEOUT_S,
                           cwd=folder / "salloc", env=environment())
    figures["fleetrun_in_allocation_ok"] = (
        allocation.returncode == 0 and f"one fleetrun on each of its {HOSTS} hosts" in allocation.stderr
        and max_relative(folder / "salloc" / "w.npy", reference) <= 1e-5)
    return figures


def mpirun_figures(slurm, folder, reference):
    slots = [f"{name}:{PER_HOST}" for name in slurm.names]
    exported = [f"PADDLE_MASTER={MASTER}", *QUIET]
    parity = slurm.hosts.run(slurm.names[0], slurm.mpirun(slots, folder / "mpirun", exported,
                                                          train("--steps", str(STEPS), "--out", "w.npy")),
                             JOB_TIMEOUT_S, cwd=folder / "mpirun", env=environment(), capture_output=True, text=True)
    figures = {"parity_max_rel": max_relative(folder / "mpirun" / "w.npy", reference) if parity.returncode == 0 else None}
    figures.update(killed_rank_figures(
        slurm, slurm.mpirun(slots, folder / "mpirun-kill", exported, train("--steps", "300", "--step_seconds", "0.2")),
        folder / "mpirun-kill"))
    return figures


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    reason = slurm_cluster.unavailable() or slurm_cluster.open_mpi_unavailable()
    if reason:
        return publish_skipped(reason, args.json)
    versions = slurm_cluster.versions()
    with tempfile.TemporaryDirectory(prefix="fleetlite-schedulers-") as folder, slurm_cluster.SlurmCluster(HOSTS) as slurm:
        folder = Path(folder)
        for name in ("one", "srun", "kill", "sbatch", "salloc", "mpirun", "mpirun-kill"):
            (folder / name).mkdir()
        subprocess.run([sys.executable, TRAIN, "--steps", str(STEPS), "--out", "w.npy"], cwd=folder / "one",
                       env=environment(), check=True, capture_output=True, timeout=JOB_TIMEOUT_S)
        reference = np.load(folder / "one" / "w.npy")
        shape = {"hosts": HOSTS, "procs_per_host": PER_HOST}
        report = {"slurm": {"version": versions["slurm"], **shape, **slurm_figures(slurm, folder, reference)},
                  "mpirun": {"version": versions["open_mpi"], **shape, **mpirun_figures(slurm, folder, reference)}}
    print(json.dumps(report, indent=1))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(report, out, indent=1)


if __name__ == "__main__":
    main()
