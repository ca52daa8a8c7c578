"""The ``r1`` command: run the pipeline, run one stage, show a run's status and report.

    r1 run                                  # embedded default: configs/tiny-cpu.yaml, local store ./r1-runs
    r1 run -c configs/qwen2.5-0.5b-gsm8k.yaml --run gsm8k-1 --store s3://bucket/r1
    r1 run --seed 1 --run seed-1            # every seed of the pipeline set to 1 (PipelineConfig.with_seed)
    r1 run --run X --from-stage rejection_sample
    r1 stage rejection_sample --run X
    r1 run --run X --force-unlock           # take the run's lease from a writer that is gone
    r1 status X [--json]
    r1 report X
    r1 eval X/final_rl --benchmarks math500,gsm8k,aime24 -n 16 --k 1,4,16
    r1 plan -c configs/qwen2.5-7b-math.yaml --gpus 8 --gpu-memory 80

Without ``PREFECT_API_URL`` ``r1 run`` and ``r1 stage`` start a temporary local Prefect server for the call;
with it, they first check that the server answers (``flows/prefect_api.py``, ``R1_PREFECT_PROBE_TIMEOUT``).
Ctrl-C stops a run in seconds: the training process group is taken down, the call's flow runs are marked
Cancelled and the command exits 130; rerunning it resumes from the last stored checkpoint.
Problems with the config, the store, the Prefect server or the data end the command with one ``error:`` line
and exit code 1 (tracebacks only with ``R1_TRACEBACK=1``: ``flows/cli_errors.py``); no call waits without bound
(S3 timeouts: ``tasks/storage/store.py``).

One writer per run: ``r1 run`` and ``r1 stage`` hold the run's lease (``tasks/storage/lease.py``) while they run; a
second writer on the same run fails at once, naming the holder.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from flows.cli_check import check_config
from flows.cli_common import (  # noqa: F401 - _config is also what tests use to read a config as the CLI does
    FORCE_UNLOCK,
    INTERRUPTED,
    RUN_NAME_HELP,
    STORE_HELP,
    _check_run_seed,
    _config,
    _existing_run,
    _fail,
    _interruptible,
    _lease,
    _refuse_held_lease,
    _prefect_api,
    _recorded_config,
    _run_flow,
    _run_name,
    _run_seeds,
    _short,
    _stage_entry,
    _store,
)
from flows.cli_eval import eval_model
from flows.deploy import deploy_command
from grpo_core.plan.memory import GiB, Hardware
from tasks.config.plan import plan_pipeline
from tasks.config.stages import all_stages
from tasks.runner.common import configure_stage_logging
from tasks.runner.launch import CHILD_ENV_DEFAULTS
from tasks.runner.monitor import status_lines

SEED_HELP = ("set every seed of the pipeline (tiny model init, data, sampling, training order) to N in the config "
             "the run records; default: the config's own seeds (the embedded default's are 0)")


def run(
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="pipeline YAML (default: the config an existing "
                                          "--run recorded, else configs/tiny-cpu.yaml)"),
    run_name: Optional[str] = typer.Option(None, "--run", help="run name (default: a new timestamped one)"),
    from_stage: Optional[str] = typer.Option(None, "--from-stage", help="rerun this stage and the ones after it"),
    stages: Optional[str] = typer.Option(None, "--stages", help="comma-separated stages to run; others are reused"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    dispatch: str = typer.Option("inline", "--dispatch", help="inline (subflows here) or deployments"),
    force_unlock: bool = typer.Option(False, "--force-unlock", help=FORCE_UNLOCK),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help=SEED_HELP),
) -> None:
    """Run the whole R1 pipeline (stages whose committed output matches are reused)."""
    if run_name is not None:
        _run_name(run_name)
    selected = [s.strip() for s in stages.split(",")] if stages else None
    for name in [*(selected or []), *([from_stage] if from_stage else [])]:
        _stage_entry(name)
    # A config given is checked before the store is touched: a bad file writes nothing.
    cfg = _config(config) if config is not None or run_name is None else None
    st = _store(store)
    if cfg is None:
        # An existing run goes on with the config it recorded (as `r1 stage` does), not the embedded default:
        # rerunning a stage of a run started with -c FILE must not swap its config behind the user's back.
        cfg = _recorded_config(st, run_name)
        if cfg is not None:
            typer.echo(f"run {run_name}: the config it recorded (pass -c FILE to run another)")
        else:
            cfg = _config(None)
    if seed is not None:
        cfg = cfg.with_seed(seed)
    if run_name is not None:  # in a second: before Prefect and torch are imported and the API's server starts
        _refuse_held_lease(st, run_name, force_unlock)
    if seed is not None and run_name is not None:
        _check_run_seed(st, run_name, seed)
    # heavy import (prefect): `r1 --help`, plan and check start without it
    from flows.r1_pipeline import new_run_name, r1_pipeline

    configure_stage_logging()
    name = run_name or new_run_name()
    with _interruptible(), _prefect_api(), _lease(st, name, force_unlock):  # the API before the lease and any flow
        typer.echo(f"run {name} -> {st.url}/{name}")
        result = _run_flow(r1_pipeline, config=cfg, run_name=name, stages=selected, from_stage=from_stage,
                           store=st.url, dispatch=dispatch)
    _print_status(st, name)
    typer.echo(f"report: {result['report']}")


def stage(
    name: str = typer.Argument(..., help="a stage name (listed above)"),
    run_name: str = typer.Option(..., "--run", help="the run whose committed upstream outputs this stage reads"),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="default: the config the run recorded; given, "
                                          "it is recorded as the run's config (as r1 run -c does)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    force_unlock: bool = typer.Option(False, "--force-unlock", help=FORCE_UNLOCK),
    seed: Optional[int] = typer.Option(None, "--seed", min=0, help="check that the run uses this seed (with -c: set "
                                       "it in that config); a run started with another seed is refused"),
) -> None:
    """Run (or rerun) one stage of an existing run; upstream outputs come from the store."""
    _stage_entry(name)
    _run_name(run_name)
    cfg = _config(config) if config else None
    if cfg is not None and seed is not None:
        cfg = cfg.with_seed(seed)
    st = _store(store)
    _refuse_held_lease(st, run_name, force_unlock)  # in a second: before Prefect, torch and the API's server start
    if seed is not None:
        _check_run_seed(st, run_name, seed)  # the stage's upstream outputs were made with the run's seeds
    # heavy import (prefect): `r1 --help`, plan and check start without it
    from flows.stages import record_run_config, stage_flow

    configure_stage_logging()
    with _interruptible(), _prefect_api(), _lease(st, run_name, force_unlock):
        if cfg is not None:  # as `r1 run -c` does: the run's later stages and commands read it back
            record_run_config(st, run_name, cfg)
        ref = _run_flow(stage_flow(name), run=run_name, config=cfg, store=st.url, force=True)
    typer.echo(f"{name}: committed {st.uri_of(ref['path'])}")


def status(
    run_name: str = typer.Argument(..., metavar="NAME", help=RUN_NAME_HELP),
    as_json: bool = typer.Option(False, "--json", help="one JSON object: {run, stages: {stage: {state, uri, path, "
                                 "metrics, stale_upstream (state stale only)}}, seeds: {field: seed}} (seeds: from the run's saved config)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """The stages of a run: state, key metrics, URIs."""
    _run_name(run_name)
    st = _store(store)
    _existing_run(st, run_name)
    if as_json:
        # heavy import (prefect): `r1 --help`, plan and check start without it
        from flows.run_status import stage_status

        typer.echo(json.dumps({**stage_status(st, run_name), "seeds": _run_seeds(st, run_name, strict=False)}))
    else:
        _print_status(st, run_name)


def report(
    run_name: str = typer.Argument(..., metavar="NAME", help=RUN_NAME_HELP),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
) -> None:
    """Rebuild the run's report (emergence table + plots) in the store and print it."""
    _run_name(run_name)
    st = _store(store)
    _existing_run(st, run_name)
    # heavy import (prefect): `r1 --help`, plan and check start without it
    from flows.report import write_report

    rep = write_report(st, run_name)
    typer.echo(rep.markdown)
    typer.echo(f"\nreport: {rep.uri}")


def plan(
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="pipeline YAML (default: configs/tiny-cpu.yaml)"),
    gpus: int = typer.Option(1, "--gpus", min=1, help="GPUs per training stage (torchrun processes)"),
    gpu_memory: float = typer.Option(80.0, "--gpu-memory", min=0.1, help="memory of one GPU, GiB"),
) -> None:
    """Predict each GPU stage's per-GPU memory peak; exit 1 naming the first stage that does not fit."""

    cfg = _config(config)
    try:
        plans = plan_pipeline(cfg, Hardware(gpus=gpus, gpu_memory=int(gpu_memory * GiB)))
    except ValueError as e:  # a model the planner cannot size
        _fail(str(e))
    for p in plans:
        typer.echo(p.table() + "\n")
    failed = next((p for p in plans if not p.fits), None)
    if failed is not None:
        _fail(failed.failure_message())
    typer.echo(f"every GPU stage fits {gpus}x {gpu_memory:g} GiB")


KEY_METRICS = ("eval/accuracy", "eval/pass@1", "eval/mean_length", "data/num_train", "num_kept", "train/loss", "reward",
               "eval/pair_accuracy")


def _print_status(st: Any, run_name: str) -> None:
    # heavy import (prefect): `r1 --help`, plan and check start without it
    from flows.run_status import stage_status

    info = stage_status(st, run_name)
    typer.echo(f"{'stage':<18}{'state':<12}{'metrics':<58}uri")
    for stage_name, s in info["stages"].items():
        shown = [f"{k.split('/')[-1]}={_short(v)}" for k, v in s["metrics"].items()
                 if k in KEY_METRICS or (k.startswith("eval/accuracy") and "reflection" not in k)][:4]
        typer.echo(f"{stage_name:<18}{s['state']:<12}{' '.join(shown):<58}{s['uri'] or ''}")
    for stage_name, s in info["stages"].items():  # the reward-hacking monitor: alarms, the checkpoint committed
        for line in status_lines(stage_name, s["metrics"]):
            typer.echo(line)
    for stage_name, s in info["stages"].items():
        if s["state"] == "stale":
            typer.echo(f"stale: {stage_name} was built on an earlier {', '.join(s['stale_upstream'])} output than the "
                       f"run's current one; rerun the run (`r1 run --run {run_name} -c CONFIG`: stages whose inputs "
                       f"changed are rebuilt, the others reused) or this stage (`r1 stage {stage_name} --run {run_name}`)")


def build_app() -> typer.Typer:
    """The ``r1`` command; its help lists the stage table as it is when built."""

    stages = "\n\n".join(f"{s.name}: {s.description}" for s in all_stages())
    cli = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                      help=f"The DeepSeek-R1 recipe as a Prefect pipeline. Stages, in order:\n\n{stages}")
    cli.command()(run)
    cli.command(help=f"{stage.__doc__}\n\nStages:\n\n{stages}")(stage)
    cli.command()(status)
    cli.command()(report)
    cli.command("eval")(eval_model)  # flows/cli_eval.py
    cli.command()(plan)
    cli.command("check")(check_config)  # flows/cli_check.py: the config in miniature, end to end
    cli.command("deploy")(deploy_command)  # work pools + deployments rendered from the stage table
    return cli


app = build_app()


def main() -> None:
    """The ``r1`` console script. After a Ctrl-C has been handled (exit 130) it skips the interpreter's teardown
    of torch, transformers and Prefect, which alone can take seconds on a busy machine."""
    for name, value in CHILD_ENV_DEFAULTS.items():  # before torch loads OpenMP: this process, its server, its stages
        os.environ.setdefault(name, value)
    try:
        app()
    except SystemExit as e:
        if e.code == INTERRUPTED:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(INTERRUPTED)
        raise


if __name__ == "__main__":
    sys.exit(main())
