"""``r1 deploy``: create the work pools if missing, then register the deployments of infra/prefect.yaml.

    r1 deploy                                        # pools `cpu` and `gpu`, both process pools
    r1 deploy --gpu-pool a100 --gpu-pool-type kubernetes

Needs a Prefect server (``PREFECT_API_URL``); deployments in the ephemeral mode would vanish with it.
Registration wraps ``prefect --no-prompt deploy --all`` run from the repository root, so the deployments
are exactly what the committed ``infra/prefect.yaml`` says; other pool names are substituted into a
temporary copy of it. Pools are created from ``infra/work-pools/*.json``; an existing pool is never
changed (its template may have been edited in the UI on purpose).

``enter_project_dir`` is the deployments' pull step (see infra/prefect.yaml).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any, Literal

import typer
import yaml

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "infra" / "prefect.yaml"
POOL_TEMPLATES = {"process": ROOT / "infra" / "work-pools" / "process.json",
                  "kubernetes": ROOT / "infra" / "work-pools" / "gpu-kubernetes.json"}
DEFAULT_POOLS = {"cpu": "cpu", "gpu": "gpu"}
PoolType = Literal["process", "kubernetes"]


class DeployError(RuntimeError):
    """Deployments could not be registered; the message says what to fix."""


def enter_project_dir() -> dict[str, str]:
    """Pull step: ``chdir`` to ``$R1_PROJECT_DIR``, else the root of the installed project (a checkout)."""
    directory = Path(os.environ.get("R1_PROJECT_DIR") or ROOT)
    if not (directory / "flows" / "stages.py").is_file():
        raise DeployError(f"{directory} is not an r1-pipeline checkout (no flows/stages.py); set R1_PROJECT_DIR")
    os.chdir(directory)
    return {"directory": str(directory)}


def pool_template(pool_type: PoolType) -> dict[str, Any]:
    return json.loads(POOL_TEMPLATES[pool_type].read_text())


def ensure_pool(name: str, pool_type: PoolType, *, description: str = "") -> bool:
    """Create work pool ``name`` from the repository's template unless it exists; True when created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            existing = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type=pool_type, description=description,
                                                   base_job_template=pool_template(pool_type)))
            return True
    if existing.type != pool_type:
        raise DeployError(f"work pool {name!r} exists with type {existing.type!r}, not {pool_type!r}; "
                          f"pick another name (--gpu-pool/--cpu-pool) or delete it (prefect work-pool delete {name})")
    return False


def render_prefect_file(pools: dict[str, str], source: Path = PREFECT_FILE) -> dict[str, Any]:
    """infra/prefect.yaml with the `cpu`/`gpu` pool names replaced by ``pools`` (anchors expanded)."""
    spec = yaml.safe_load(source.read_text())
    for deployment in spec["deployments"]:
        pool = dict(deployment["work_pool"])  # anchored mappings are shared objects: copy before editing
        pool["name"] = pools[pool["name"]]
        deployment["work_pool"] = pool
    return spec


def register_deployments(pools: dict[str, str] = DEFAULT_POOLS, *, names: list[str] | None = None) -> None:
    """``prefect --no-prompt deploy --all`` (or ``--name`` each of ``names``) over infra/prefect.yaml."""
    with tempfile.TemporaryDirectory(prefix="r1-deploy-") as tmp:
        prefect_file = PREFECT_FILE
        if pools != DEFAULT_POOLS:
            prefect_file = Path(tmp) / "prefect.yaml"
            prefect_file.write_text(yaml.safe_dump(render_prefect_file(pools), sort_keys=False))
        selection = [arg for name in names for arg in ("--name", name)] if names else ["--all"]
        cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *selection, "--prefect-file", str(prefect_file)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DeployError(f"`prefect deploy` failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")


def deployment_names() -> list[str]:
    """``flow-name/deployment-name`` of every deployment on the server whose entrypoint is in prefect.yaml."""
    from prefect.client.orchestration import get_client

    ours = {d["entrypoint"] for d in yaml.safe_load(PREFECT_FILE.read_text())["deployments"]}
    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        return sorted(f"{flows[d.flow_id]}/{d.name}" for d in client.read_deployments() if d.entrypoint in ours)


def deploy(cpu_pool: str = "cpu", gpu_pool: str = "gpu", gpu_pool_type: PoolType = "process",
           names: list[str] | None = None) -> list[str]:
    """Create missing pools, register the deployments; returns their ``flow/deployment`` names."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise DeployError("no Prefect server: start one (`prefect server start`) and set PREFECT_API_URL, e.g. "
                          "`prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`")
    if cpu_pool == gpu_pool:
        raise DeployError("--cpu-pool and --gpu-pool must differ (data preparation and training run on separate pools)")
    ensure_pool(cpu_pool, "process", description="r1-pipeline: data preparation and the pipeline flow")
    ensure_pool(gpu_pool, gpu_pool_type, description="r1-pipeline: training, sampling and evaluation stages")
    register_deployments({"cpu": cpu_pool, "gpu": gpu_pool}, names=names)
    return deployment_names()


def deploy_command(
    cpu_pool: Annotated[str, typer.Option(help="work pool for data preparation and the pipeline flow")] = "cpu",
    gpu_pool: Annotated[str, typer.Option(help="work pool for training, sampling and evaluation")] = "gpu",
    gpu_pool_type: Annotated[str, typer.Option(help="process (one machine) or kubernetes")] = "process",
    name: Annotated[list[str] | None, typer.Option("--name", help="only these deployments (flow/deployment)")] = None,
) -> None:
    """Create the work pools if missing and register the deployments of infra/prefect.yaml."""
    if gpu_pool_type not in ("process", "kubernetes"):
        raise typer.BadParameter("--gpu-pool-type must be process or kubernetes")
    try:
        registered = deploy(cpu_pool, gpu_pool, gpu_pool_type, names=name)  # type: ignore[arg-type]
    except DeployError as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(1) from None
    for full_name in registered:
        typer.echo(full_name)
    typer.echo(f"start workers: prefect worker start --pool {cpu_pool}   and   prefect worker start --pool {gpu_pool}")
