"""The Kubernetes GPU pool's base job template renders offline, with Prefect's own job-configuration code,
to a Job whose pod asks for the GPUs, memory, node placement, /dev/shm and secret-based store credentials;
the multi-node form renders to an indexed Job whose pods find node 0's rendezvous through a headless Service."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import uuid
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

pytest.importorskip("prefect_kubernetes", reason="prefect-kubernetes is in the dev extras")
from prefect.client.schemas.objects import FlowRun  # noqa: E402
from prefect_kubernetes.worker import KubernetesWorker, KubernetesWorkerJobConfiguration  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "infra" / "work-pools" / "gpu-kubernetes.json"
PROCESS_TEMPLATE = ROOT / "infra" / "work-pools" / "process.json"
MULTINODE_TEMPLATE = ROOT / "infra" / "work-pools" / "gpu-kubernetes-multinode.json"
RDZV_SERVICE = ROOT / "infra" / "k8s" / "rdzv-service.yaml"
SECRET_VALUE = "do-not-leak-8f3a1c"


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def render(values: dict[str, Any], path: Path = TEMPLATE) -> dict[str, Any]:
    """What the Kubernetes worker would submit for a flow run of a deployment with these job variables."""
    template = load(path)
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


@pytest.mark.parametrize("path", [TEMPLATE, PROCESS_TEMPLATE, MULTINODE_TEMPLATE], ids=lambda p: p.name)
def test_every_placeholder_names_a_declared_variable(path: Path) -> None:
    template = load(path)
    used = set(re.findall(r"\{\{\s*([\w]+)\s*\}\}", json.dumps(template["job_configuration"])))
    declared = set(template["variables"]["properties"])
    assert used <= declared, f"undeclared: {used - declared}"
    assert declared - used <= {"env"}, f"declared but unused: {declared - used - {'env'}}"


@pytest.mark.parametrize("path", [TEMPLATE, MULTINODE_TEMPLATE], ids=lambda p: p.name)
def test_keeps_the_kubernetes_workers_own_settings(path: Path) -> None:
    """A prefect-kubernetes upgrade that adds a worker setting shows up here rather than being silently dropped."""
    ours = set(load(path)["job_configuration"])
    default = set(KubernetesWorker.get_default_base_job_template()["job_configuration"])
    assert ours == default


def pod_env(manifest: dict[str, Any], index: int, job_name: str) -> dict[str, str]:
    """The environment Kubernetes gives pod ``index``: downward-API fields filled in, ``$(VAR)`` expanded in
    order (a reference resolves only to a variable defined earlier in the list, as in Kubernetes)."""
    fields = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(index),
              "metadata.labels['batch.kubernetes.io/job-name']": job_name}
    env: dict[str, str] = {}
    for item in container(manifest)["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env.get(m[1], m[0]), str(item["value"]))
    return env


def test_multinode_form_is_an_indexed_job_whose_pods_meet_at_pod_0() -> None:
    from tasks.runner.launch import Nodes, resolve_nodes

    manifest = render({"nnodes": 3, "gpu_count": 8, "rdzv_port": 29500, "env": {"R1_STORE": "s3://b/r1"}},
                      MULTINODE_TEMPLATE)
    spec = manifest["spec"]
    assert spec["completionMode"] == "Indexed" and spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimit"] == 0  # one failed node fails the stage; Prefect's retry restarts all nodes
    pod = spec["template"]
    assert container(manifest)["resources"]["limits"]["nvidia.com/gpu"] == 8
    service = yaml.safe_load(RDZV_SERVICE.read_text())
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert pod["spec"]["subdomain"] == service["metadata"]["name"]  # DNS <pod hostname>.<subdomain>
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    for index in range(3):
        env = pod_env(manifest, index, "grpo-train-x7k2p")
        assert env["R1_NPROC_PER_NODE"] == "8" and env["R1_STORE"] == "s3://b/r1" and env["PREFECT__FLOW_RUN_ID"]
        # an indexed Job's pod is named <job>-<index>: every node points at pod 0
        assert resolve_nodes(env) == Nodes(nnodes=3, node_rank=index, rdzv_endpoint="grpo-train-x7k2p-0.r1-rdzv:29500",
                                           rdzv_id="grpo-train-x7k2p")
    assert container(manifest)["ports"] == [{"name": "rdzv", "containerPort": 29500}]
    # pod 0 runs the flow run (Prefect's command, the args); the others join as tasks.runner.follower
    script = container(manifest)["command"]
    assert container(manifest)["args"] == ["prefect", "flow-run", "execute"]
    for rank, expected in (("0", "prefect flow-run execute"), ("2", "python -m tasks.runner.follower")):
        shown = subprocess.run([*script[:2], script[2].replace("exec ", "echo "), *script[3:], *container(manifest)["args"]],
                               env={"R1_NODE_RANK": rank, "PATH": os.environ["PATH"]}, capture_output=True, text=True)
        assert shown.stdout.splitlines()[0] == expected, (rank, shown.stdout)
    # prefect-kubernetes checks a manifest against a base Job holding completions/parallelism = 1 in the *pod*
    # spec (only a move of a job-level 1 satisfies it otherwise); the API server drops these unknown pod fields
    assert (pod["spec"]["completions"], pod["spec"]["parallelism"]) == (1, 1)


def test_multinode_variables_are_checked() -> None:
    with pytest.raises(jsonschema.ValidationError):
        render({"nnodes": 0}, MULTINODE_TEMPLATE)
    with pytest.raises(jsonschema.ValidationError):
        render({"rdzv_service": "Not_A_DNS_Label"}, MULTINODE_TEMPLATE)


def test_process_pool_node_variables_reach_the_launcher() -> None:
    from prefect.workers.process import ProcessJobConfiguration

    from tasks.runner.launch import Nodes, resolve_nodes

    def node_env(values: dict[str, Any]) -> dict[str, str]:
        config = asyncio.run(ProcessJobConfiguration.from_template_and_values(load(PROCESS_TEMPLATE), values,
                                                                              client=object()))
        return {k: "" if v is None else str(v) for k, v in config.env.items()}

    assert resolve_nodes(node_env({})) == Nodes()  # defaults: one node
    env = node_env({"nnodes": 2, "node_rank": 1, "rdzv_endpoint": "gpu-a:29400", "rdzv_id": "exp-1-grpo"})
    assert resolve_nodes(env) == Nodes(2, 1, "gpu-a:29400", "exp-1-grpo")
