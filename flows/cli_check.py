"""``r1 check``: run a config end to end in miniature (``tasks/check.py``) before spending GPU hours on it.

    r1 check -c configs/qwen2.5-0.5b-gsm8k.yaml            # the plan, the miniature run, what the real run spends
    r1 check -c my.yaml --rows 16 --steps 3 --keep /tmp/chk  # keep the miniature run's store to look at

Every stage runs, in order, through the same Prefect flow as ``r1 run``, on a temporary store (nothing is
written to the run's store); it fails with the message the real run would give. Exit code 0: the config ran
through; 1: the first failure, named.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Optional

import typer

from flows.cli_common import _config, _fail, _interruptible, _prefect_api, _run_flow
from tasks.check import MiniatureError, build_miniatures, consumption, format_consumption, miniature_pipeline
from tasks.config.pipeline import ConfigError
from tasks.config.plan import HARDWARE_LINE, config_hardware, plan_pipeline
from tasks.runner.common import configure_stage_logging
from tasks.storage.store import Store


def check_config(
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="pipeline YAML (default: configs/tiny-cpu.yaml)"),
    rows: int = typer.Option(8, "--rows", min=2, help="rows read from every data source"),
    steps: int = typer.Option(2, "--steps", min=1, help="optimiser steps per training stage"),
    keep: Optional[Path] = typer.Option(None, "--keep", help="keep the miniature run's models and store in this folder"),
) -> None:
    """Preflight: the config's every stage, source, reward function and reward model, in miniature, in minutes."""

    cfg = _config(config)
    start = time.monotonic()
    path = Path(config) if config else None
    hardware = config_hardware(path) if path is not None and HARDWARE_LINE.search(path.read_text()) else None
    if hardware is not None and hardware.device != "cpu":
        typer.echo(f"plan for {hardware.gpus}x {hardware.gpu_memory / 2**30:g} GiB (the config's hardware header):")
        try:
            plans = plan_pipeline(cfg, hardware)
        except ValueError as e:
            _fail(f"r1 plan: {e}")
        for p in plans:
            typer.echo(p.table() + "\n")
        failed = next((p for p in plans if not p.fits), None)
        if failed is not None:
            _fail(failed.failure_message())
    typer.echo("what the real run spends:\n" + format_consumption(consumption(cfg, hardware.gpus if hardware else 1)))
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix="r1-check-"))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        try:
            import torch

            mini = miniature_pipeline(cfg, build_miniatures(workdir), rows=rows, steps=steps,
                                      cuda=torch.cuda.is_available())
        except (MiniatureError, ConfigError) as e:
            _fail(str(e))
        typer.echo(f"\nminiature run: {rows} rows a source, {steps} steps a training stage, every model at 2 narrow "
                   f"layers, rejection sampling keeping every sample it scores ({time.monotonic() - start:.0f} s to build)")
        # heavy import (prefect): only the miniature's run needs it
        from flows.r1_pipeline import r1_pipeline
        from flows.run_status import stage_status

        configure_stage_logging()
        os.environ["R1_WORKDIR"] = str(workdir / "work")  # the stages' scratch files go with the check's folder
        store = Store(str(workdir / "store"))
        with _interruptible(), _prefect_api():
            _run_flow(r1_pipeline, config=mini, run_name="check", stages=None, from_stage=None, store=store.url,
                      dispatch="inline")
        info = stage_status(store, "check")
        for name, s in info["stages"].items():
            shown = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in s["metrics"].items()
                              if k.startswith(("data/num", "eval/accuracy", "rs/num_kept", "train/loss")))[:150]
            typer.echo(f"  {name:<18}{s['state']:<11}{shown}")
        typer.echo(f"check passed in {time.monotonic() - start:.0f} s: every stage ran" +
                   (f"; kept in {workdir}" if keep else ""))
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
