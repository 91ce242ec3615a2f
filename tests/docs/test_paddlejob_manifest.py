"""The PaddleJob manifest in examples/kubernetes (shown in docs/clusters.md) parses, and runs the
digits example through fleetrun with what the pod contract needs (POD_IP from the pod's status).
No Kubernetes runs here: tests/launcher/test_scheduler_variables.py runs the contract itself."""
from pathlib import Path

import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "examples" / "kubernetes" / "paddlejob.yaml"


def test_the_paddlejob_manifest_parses_and_runs_the_digits_example_with_fleetrun():
    job = yaml.safe_load(MANIFEST.read_text())
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PaddleJob")
    worker = job["spec"]["paddleReplicaSpecs"]["Worker"]
    (container,) = worker["template"]["spec"]["containers"]
    assert container["command"][0] == "fleetrun" and "examples/train_digits.py" in container["command"]
    assert (Path(MANIFEST).parents[2] / "examples" / "train_digits.py").exists()
    pod_ip = next(e for e in container["env"] if e["name"] == "POD_IP")
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert worker["replicas"] >= 2
