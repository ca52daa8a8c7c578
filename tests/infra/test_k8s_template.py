"""The Kubernetes GPU pool's base job template renders offline, with Prefect's own job-configuration code,
to a Job whose pod asks for the GPUs, memory, node placement, /dev/shm and secret-based store credentials."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest

pytest.importorskip("prefect_kubernetes", reason="prefect-kubernetes is in the dev extras")
from prefect.client.schemas.objects import FlowRun  # noqa: E402
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "work-pools" / "gpu-kubernetes.json"
PROCESS_TEMPLATE = ROOT / "infra" / "work-pools" / "process.json"
SECRET_VALUE = "do-not-leak-8f3a1c"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def render(values: dict[str, Any]) -> dict[str, Any]:
    """What the Kubernetes worker would submit for a flow run of a deployment with these job variables."""
    template = load(TEMPLATE)
    jsonschema.validate(values, template["variables"])  # the server checks job variables against this schema
    # client=object(): the template references no blocks or Prefect variables, so no API is needed.
    config = asyncio.run(KubernetesWorkerJobConfiguration.from_template_and_values(template, values, client=object()))
    flow_run = FlowRun(id=uuid.uuid4(), name="brave-otter", flow_id=uuid.uuid4())
    config.prepare_for_flow_run(flow_run)
    return config.job_manifest


@pytest.fixture
def manifest(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    # Credentials in the worker's own environment must not be copied into the pod spec.
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_VALUE)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", SECRET_VALUE)
    return render({
        "gpu_count": 4,
        "memory": "180Gi",
        "cpu": "32",
        "node_selector": {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"},
        "env": {"R1_STORE": "s3://team-bucket/r1"},
        "store_secret_name": "team-s3",
    })


def container(manifest: dict[str, Any]) -> dict[str, Any]:
    return manifest["spec"]["template"]["spec"]["containers"][0]


def test_gpu_count_maps_to_nvidia_gpu_requests_limits_and_torchrun(manifest: dict[str, Any]) -> None:
    res = container(manifest)["resources"]
    assert res["limits"]["nvidia.com/gpu"] == 4
    assert res["requests"]["nvidia.com/gpu"] == 4
    assert res["limits"]["memory"] == res["requests"]["memory"] == "180Gi"
    assert res["limits"]["cpu"] == "32"
    env = {e["name"]: e.get("value") for e in container(manifest)["env"]}
    assert env["R1_NPROC_PER_NODE"] == "4"  # the training stages read this to launch torchrun
    assert env["R1_STORE"] == "s3://team-bucket/r1"  # deployment env merges with the template's
    assert env["PREFECT__FLOW_RUN_ID"]  # the worker's own variables are still there


def test_node_placement_and_shm(manifest: dict[str, Any]) -> None:
    pod = manifest["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    (mount,) = [m for m in container(manifest)["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert vol["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    assert pod["restartPolicy"] == "Never" and manifest["spec"]["backoffLimit"] == 0
    assert container(manifest)["image"] == "r1-pipeline-gpu:latest"
    assert container(manifest)["args"] == ["prefect", "flow-run", "execute"]


def test_store_credentials_come_from_a_secret_never_inline(manifest: dict[str, Any]) -> None:
    assert container(manifest)["envFrom"] == [{"secretRef": {"name": "team-s3"}}]
    names = {e["name"] for e in container(manifest)["env"]}
    assert not names & {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"}
    assert SECRET_VALUE not in json.dumps(manifest)


def test_defaults_render_one_gpu_with_default_placement() -> None:
    manifest = render({})
    assert container(manifest)["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert manifest["spec"]["template"]["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert container(manifest)["envFrom"] == [{"secretRef": {"name": "r1-store-credentials"}}]


def test_bad_job_variables_are_rejected_by_the_schema() -> None:
    with pytest.raises(jsonschema.ValidationError):
        render({"gpu_count": "four"})
    with pytest.raises(jsonschema.ValidationError):
        render({"gpu_count": -1})


@pytest.mark.parametrize("path", [TEMPLATE, PROCESS_TEMPLATE], ids=lambda p: p.name)
def test_every_placeholder_names_a_declared_variable(path: Path) -> None:
    template = load(path)
    used = set(re.findall(r"\{\{\s*([\w]+)\s*\}\}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used <= declared, f"undeclared: {used - declared}"
    assert declared - used <= {"env"}, f"declared but unused: {declared - used - {'env'}}"


def test_keeps_the_kubernetes_workers_own_settings() -> None:
    """A prefect-kubernetes upgrade that adds a worker setting shows up here rather than being silently dropped."""
    ours = set(load(TEMPLATE)["job_configuration"])
    default = set(KubernetesWorker.get_default_base_job_template()["job_configuration"])
    assert ours == default
