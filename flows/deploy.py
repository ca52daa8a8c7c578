"""``r1 deploy``: create the work pools if missing, then register the deployments rendered from the stage table.

    r1 deploy                                        # pools `cpu` and `gpu`, both process pools
    r1 deploy --gpu-pool a100 --gpu-pool-type kubernetes
    python -m flows.deploy                           # rewrite infra/prefect.yaml from the stage table

The deployments are the pipeline flow plus one per stage of ``tasks/config/stages.py`` (on the stage's pool), so
a new table entry is deployed with no other edit. ``infra/prefect.yaml`` is this rendering, committed for
users who run ``prefect deploy`` themselves; a test keeps it equal to the table. Needs a Prefect server
(``PREFECT_API_URL``; deployments in the ephemeral mode would vanish with it), asked first whether it answers
(``flows/prefect_api.py``), so a silent server fails in seconds rather than after Prefect's retries. Registration wraps
``prefect --no-prompt deploy`` run from the repository root over a rendered temporary file. Pools are
created from ``infra/work-pools/*.json``; an existing pool is never changed (its template may have been
edited in the UI on purpose).

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
from flows.prefect_api import PrefectAPIUnreachable, check_prefect_api
from tasks.config.stages import all_stages

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


PREFECT_HEADER = """\
# GENERATED from the stage table (tasks/config/stages.py) by `python -m flows.deploy`; edit the table, not this file.
# Deployments of the R1 pipeline and of each stage flow, on two work pools: `cpu` (data preparation and the
# pipeline's orchestrating flow) and `gpu` (training, sampling, evaluation).
#   r1 deploy                                   # creates the pools if missing, then registers all of these
#   prefect --no-prompt deploy --all --prefect-file infra/prefect.yaml    # the same, pools must exist
# Run from the repository root: entrypoints are relative to it.
#   prefect deployment run 'r1-pipeline/cpu'                  # the embedded default (configs/tiny-cpu.yaml)
#   prefect deployment run 'r1-pipeline/cpu' -p config_path=configs/qwen2.5-0.5b-gsm8k.yaml -p run_name=n1
#   prefect deployment run 'grpo-train/gpu' -p run=n1         # one stage of an existing run
# Stage flows read their upstream outputs from the store; only store references cross between runs.
# No build or push: the code is already where the worker runs (a checkout with `pip install -e .`, or the
# images from infra/docker/). The pull step enters $R1_PROJECT_DIR (the images set /opt/r1-pipeline), else
# the folder the installed `flows` package lives in (a checkout). GPU stages: one run at a time per
# deployment, further runs wait in the queue. The weekly schedule is created inactive.
"""


def prefect_spec(pools: dict[str, str] = DEFAULT_POOLS) -> dict[str, Any]:
    """The prefect.yaml content for the current stage table, with work pools named ``pools``."""

    work_pools = {kind: {"name": pools[kind], "work_queue_name": "default", "job_variables": {}} for kind in ("cpu", "gpu")}
    gpu_concurrency = {"limit": 1, "collision_strategy": "ENQUEUE"}
    stage_parameters = {"store": None, "force": True}
    weekly = [{"cron": "0 3 * * 1", "timezone": "UTC", "active": False}]
    deployments: list[dict[str, Any]] = [{
        "name": "cpu", "entrypoint": "flows/r1_pipeline.py:r1_pipeline",
        "description": "The whole R1 recipe; each stage runs as its own deployment on its pool. No config_path: "
                       "the embedded default, as `r1 run`.",
        "tags": ["r1", "pipeline"], "parameters": {"dispatch": "deployments", "store": None, "config_path": None},
        "work_pool": work_pools["cpu"], "schedules": weekly,
    }]
    for stage in all_stages():
        d = {"name": stage.pool, "entrypoint": f"flows/stages.py:{stage.name}_flow", "description": stage.description,
             "tags": ["r1", "stage", stage.pool], "parameters": stage_parameters, "work_pool": work_pools[stage.pool]}
        if stage.pool == "gpu":
            d["concurrency_limit"] = gpu_concurrency
        deployments.append(d)
    return {"name": "r1-pipeline", "prefect-version": "3.9.1", "build": None, "push": None,
            "pull": [{"flows.deploy.enter_project_dir": {}}],
            "definitions": {"work_pools": work_pools, "gpu_concurrency": gpu_concurrency,
                            "stage_parameters": stage_parameters, "schedules": {"weekly": weekly}},
            "deployments": deployments}


def render_prefect_file(pools: dict[str, str] = DEFAULT_POOLS) -> str:
    """``prefect_spec`` as YAML, shared pieces written once as anchors named after their definitions."""
    spec = prefect_spec(pools)
    defs = spec["definitions"]
    names = {id(defs["work_pools"]["cpu"]): "cpu_pool", id(defs["work_pools"]["gpu"]): "gpu_pool",
             id(defs["gpu_concurrency"]): "gpu_concurrency", id(defs["stage_parameters"]): "stage_parameters",
             id(defs["schedules"]["weekly"]): "weekly_inactive"}

    class Dumper(yaml.SafeDumper):
        def generate_anchor(self, node: Any) -> str:
            obj = next((o for o, n in self.represented_objects.items() if n is node), None)
            return names.get(obj, super().generate_anchor(node))  # keys of represented_objects are id()s

        def ignore_aliases(self, data: Any) -> bool:
            return id(data) not in names

    return PREFECT_HEADER + yaml.dump(spec, Dumper=Dumper, sort_keys=False, width=120)


def write_prefect_file(path: Path = PREFECT_FILE) -> Path:
    path.write_text(render_prefect_file())
    return path


def register_deployments(pools: dict[str, str] = DEFAULT_POOLS, *, names: list[str] | None = None) -> None:
    """``prefect --no-prompt deploy --all`` (or ``--name`` each of ``names``) over the rendered deployments."""
    with tempfile.TemporaryDirectory(prefix="r1-deploy-") as tmp:
        prefect_file = Path(tmp) / "prefect.yaml"
        prefect_file.write_text(render_prefect_file(pools))
        selection = [arg for name in names for arg in ("--name", name)] if names else ["--all"]
        cmd = [sys.executable, "-m", "prefect", "--no-prompt", "deploy", *selection, "--prefect-file", str(prefect_file)]
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DeployError(f"`prefect deploy` failed (exit {proc.returncode}):\n{proc.stdout[-4000:]}{proc.stderr[-4000:]}")


def deployment_names() -> list[str]:
    """``flow-name/deployment-name`` of every deployment on the server whose entrypoint is one of ours."""
    from prefect.client.orchestration import get_client

    ours = {d["entrypoint"] for d in prefect_spec()["deployments"]}
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
    try:
        check_prefect_api(serverless_ok=False)
    except PrefectAPIUnreachable as e:
        raise DeployError(str(e)) from None
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
    """Create the work pools if missing and register the deployments (the pipeline and one per stage)."""
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


if __name__ == "__main__":  # python -m flows.deploy: rewrite infra/prefect.yaml from the stage table
    if sys.argv[1:2] in (["-h"], ["--help"]):
        typer.echo("usage: python -m flows.deploy   (rewrites infra/prefect.yaml from the stage table; `r1 deploy "
                   "--help` registers the deployments)")
        sys.exit(0)
    typer.echo(f"wrote {write_prefect_file()}")
