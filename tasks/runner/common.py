"""What every stage task shares: fingerprints, the retry rule, store fetches, artifacts.

Caching: a stage is skipped when the store already holds a committed output whose manifest carries the
same fingerprint (sha256 of the stage's config section, the fields set away from their defaults, + the content of
the local model folders it names + the exact upstream versions it read: ``fingerprint``).
The store is checked directly instead of Prefect's result cache (``cache_key_fn``): the store is the one
source of truth, so a cache hit works from any machine that can read the store, a deleted output is
never "cached", and nothing depends on where Prefect keeps its result records. Task source is not in
the key, so editing code does not throw away a finished training run. A hit ends the task in a
``Cached`` state, which the Prefect UI shows as such.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from grpo_core.config import REWARD_MODEL_STAGE
from tasks.config.fingerprint_fields import keyed_fields, model_folders
from tasks.config.pipeline import PipelineConfig
from tasks.config.sections import replace_stage_references, uses_reward_model_stage
from tasks.config.stages import Stage, get_entry
from tasks.storage.manifest import StageRef
from tasks.storage.scratch import new_scratch
from tasks.storage.store import IntegrityError, StageWriter, Store, TransientStoreError


Body = Callable[["StageContext", dict[str, StageRef], str], StageRef]


class WorkerCrashed(RuntimeError):
    """The process running a stage died (killed, out of memory, segfault): worth a retry."""


class StageFailed(RuntimeError):
    """The stage's code raised (a bug, bad data, a NaN loss): a retry would fail the same way."""


RETRIABLE = (WorkerCrashed, TransientStoreError, ConnectionError, TimeoutError)


def retry_on_crash(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect ``retry_condition_fn``: retry crashes and storage errors only, never code errors."""
    try:
        exc = state.result(raise_on_failure=False)
    except Exception:  # noqa: BLE001 - an unreadable state is not worth a retry
        return False
    return isinstance(exc, RETRIABLE)


@dataclass(frozen=True, eq=False)
class StageBody:
    """A stage body, ``body(ctx, parents, fp) -> StageRef``, and what its fingerprint holds beyond its section and
    parents. It names no stage: ``task(entry)`` makes it the Prefect task of a table entry whose ``body`` names it,
    so two entries may share one body (grpo_train and final_rl are ``tasks/stages/rl.py``)."""

    body: Body
    key_model: bool = False  # the model section too (prepare_data builds the tiny base model from it)
    referenced: Callable[[Any, Store], dict[str, StageRef]] | None = None  # (section, store): outputs the section names
    fingerprint_inputs: Callable[[Any], dict[str, Any]] | None = None  # (section): e.g. its data files' hashes
    tasks: dict[Stage, Any] = field(default_factory=dict, repr=False)  # entry -> its task, made once

    def task(self, entry: Stage) -> Any:
        """``entry``'s Prefect task, named after it: ``task(config, run, store, inputs, force)`` (module docstring of
        ``stage_task``)."""
        if entry not in self.tasks:
            self.tasks[entry] = self._make_task(entry)
        return self.tasks[entry]

    def _make_task(self, entry: Stage) -> Any:
        def run_stage_task(config: PipelineConfig, run: str, store: str | None = None,
                           inputs: dict[str, StageRef] | None = None, force: bool = False) -> Any:
            with StageContext.open(config, run, store, entry) as ctx:
                parents = dict(inputs or {})
                if self.referenced is not None:
                    parents.update(self.referenced(ctx.section, ctx.store))
                extra: dict[str, Any] = {"model": config.model} if self.key_model else {}
                if self.fingerprint_inputs is not None and (read := self.fingerprint_inputs(ctx.section)):
                    extra["inputs"] = read  # only when there are any: a fingerprint without them stays as it was
                return reuse_or_build(ctx, entry.name, ctx.section, parents, extra, force,
                                      lambda fp: self.body(ctx, parents, fp))

        run_stage_task.__name__ = run_stage_task.__qualname__ = entry.name
        run_stage_task.__doc__ = self.body.__doc__
        run_stage_task.__module__ = self.body.__module__
        return stage_task_options(entry.name)(run_stage_task)


def stage_task(body: Body | None = None, /, *, key_model: bool = False,
               referenced: Callable[[Any, Store], dict[str, StageRef]] | None = None,
               fingerprint_inputs: Callable[[Any], dict[str, Any]] | None = None) -> Any:
    """``@stage_task`` (or ``@stage_task(...)`` with options) makes ``body(ctx, parents, fp) -> StageRef`` a
    ``StageBody``; the stage table's entry that names it (``Stage.body``) makes it its task, with what every stage
    does around its body: open the context (``ctx.entry`` is the entry, ``ctx.section`` its config section),
    fingerprint the section (``key_model`` adds the model section) and the exact parent outputs it reads (the
    upstream stages', and those ``referenced(section, store)`` names in the section, e.g. another run's model) and
    what ``fingerprint_inputs(section)`` returns (prepare_data: its data files' hashes, tasks/storage/data_inputs.py),
    reuse a committed output with that fingerprint unless forced, and remove the scratch folder at the end.

    The task is called ``task(config, run, store, inputs, force)``; ``inputs`` maps each upstream stage
    (``Stage.inputs``) to its committed ``StageRef``. Retries: crashes and storage errors only
    (``retry_on_crash``). No Prefect result cache: the store's manifests are the cache (module docstring).
    """
    if isinstance(body, str):
        raise TypeError(f"stage_task takes no stage name ({body!r}): a body reads its name, kind and section from its "
                        "table entry; write @stage_task and name the body in the entry (tasks/config/stages.py)")

    def make(fn: Body) -> StageBody:
        return StageBody(fn, key_model, referenced, fingerprint_inputs)

    return make(body) if body is not None else make


def reuse_or_build(ctx: "StageContext", stage: str, section: BaseModel, parents: dict[str, StageRef],
                   extra: dict[str, Any] | None, force: bool, build: Callable[[str], StageRef],
                   why: str = "same config and inputs") -> Any:
    """What every stage does around its work (``stage_task``'s tasks and evaluation): fingerprint ``section`` and
    the exact ``parents`` (and ``extra``, and the content of the local model folders ``section`` and the sections in
    ``extra`` name), reuse the committed output with that fingerprint unless ``force``d (a ``Cached`` state), else
    ``build(fingerprint)``."""
    if folders := model_folders(section, *(v for v in (extra or {}).values() if isinstance(v, BaseModel))):
        extra = {**(extra or {}), "model_folders": folders}  # only when there are any (a hub or tiny model: none)
    fp = fingerprint(stage, section, parents, extra)
    if (ref := ctx.reuse(fp, force)) is not None:
        return cached(ref, why)
    return build(fp)


def stage_task_options(name: str) -> Any:
    """The Prefect task decorator of every stage task: retries for crashes and storage errors only, and no
    Prefect result cache (the store's manifests are the cache; see the module docstring)."""
    from prefect import task
    from prefect.cache_policies import NO_CACHE

    return task(name=name, retries=2, retry_delay_seconds=2, retry_condition_fn=retry_on_crash, cache_policy=NO_CACHE)


def fingerprint(stage: str, section: BaseModel | dict[str, Any], parents: dict[str, StageRef],
                extra: dict[str, Any] | None = None) -> str:
    """sha256 over the stage's config section, the exact upstream outputs (versions) it reads and ``extra`` (the
    model section, input files' hashes, model folders' content).

    A section (and a section in ``extra``) counts by its fields set away from their defaults
    (``tasks.config.fingerprint_fields.keyed_fields``): an option added to the code, with a default, changes no
    fingerprint, so a store's committed stages stay reusable. A default changed in code is a code change and keeps
    them too (rebuild with ``r1 stage NAME`` or ``--from-stage``, or write the field in the config). Fingerprints made
    before this rule (the whole section, defaults included) all differ from today's: such a store's stages are
    rebuilt once."""
    payload = {"stage": stage, "config": keyed_fields(section),
               "parents": {k: v.parent_entry() for k, v in sorted(parents.items())}, "extra": keyed_fields(extra or {})}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:32]


def logger() -> logging.Logger | logging.LoggerAdapter:
    try:
        from prefect import get_run_logger

        return get_run_logger()
    except Exception:  # noqa: BLE001 - outside a Prefect run (plain function call, worker process)
        return logging.getLogger("r1")


def configure_stage_logging() -> None:
    """What a stage's log shows of progress: no transformers/hub progress bars ("Loading weights", "Writing
    model shards"; in a Prefect log each redraw is a line), but the trainers' own step lines: logger
    ``grpo_core`` at INFO, also sent to the run's Prefect log through Prefect's API handler (what
    ``PREFECT_LOGGING_EXTRA_LOGGERS`` would attach) when Prefect is set up in this process."""
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:
        pass
    target = logging.getLogger("grpo_core")
    target.setLevel(logging.INFO)
    if "prefect" not in sys.modules:  # the training child: its stdout is the log
        return
    from prefect.logging.handlers import APILogHandler

    # Only the API handler: the terminal gets the lines through the root logger already, and whatever
    # else sits on "prefect.extra" (a test harness's capture handlers, say) is not ours to copy.
    for handler in logging.getLogger("prefect.extra").handlers:
        if isinstance(handler, APILogHandler) and handler not in target.handlers:
            target.addHandler(handler)


def artifact_key(*parts: str) -> str:
    """Prefect artifact keys: lowercase letters, digits and dashes only."""
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", "-".join(parts).lower())).strip("-")


def cached(ref: StageRef, why: str) -> Any:
    """A Completed state named ``Cached`` carrying ``ref``: what a skipped stage's task returns."""
    from prefect.states import Completed

    logger().info(f"{ref.stage}: reusing committed output {ref.uri} ({why})")
    return Completed(data=ref, name="Cached", message=f"{why}: {ref.uri}")


def in_prefect_run() -> bool:
    """True inside a flow or task run (artifacts need one; outside, Prefect would start a server)."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext

        return bool(FlowRunContext.get() or TaskRunContext.get())
    except Exception:  # noqa: BLE001
        return False


def publish_metrics(run: str, stage: str, ref: StageRef, metrics: dict[str, Any], title: str = "") -> None:
    """A table artifact with the stage's metrics (no-op outside a Prefect run)."""
    if not in_prefect_run():
        return
    try:
        from prefect.artifacts import create_table_artifact

        rows = [{"metric": k, "value": _fmt(v)} for k, v in sorted(metrics.items())]
        rows.append({"metric": "uri", "value": ref.uri})
        create_table_artifact(rows, key=artifact_key(run, stage, title or "metrics"),
                              description=f"{stage} {title or 'metrics'} of run {run}")
    except Exception as e:  # noqa: BLE001 - artifacts are a view; never fail a stage over one
        logging.getLogger("r1").debug("no artifact: %s", e)


def _fmt(v: Any) -> Any:
    return round(v, 4) if isinstance(v, float) else v


class Progress:
    """A Prefect progress artifact for a training stage, updated from the trainer's step callback."""

    SHOWN = ("reward", "loss")
    HELDOUT = ("eval/accuracy", "eval/pass@1", "eval/reflection_rate")  # eval_steps: shown until the next one

    def __init__(self, run: str, stage: str) -> None:
        self.id = None
        self.client: Any = None
        self.last = -1.0
        self.heldout: dict[str, Any] = {}
        if not in_prefect_run():
            return
        try:
            from prefect.artifacts import create_progress_artifact
            from prefect.client.orchestration import get_client

            self.id = create_progress_artifact(0.0, key=artifact_key(run, stage, "progress"),
                                               description=f"{stage} of run {run}: optimiser steps done")
            # one client for every update: Prefect's update_progress_artifact makes a new one per call, and each
            # loads the CA bundle (~0.2 s of CPU on 2 cores): ~100 updates a stage cost the trainer a core for minutes
            self.client = get_client(sync_client=True)
        except Exception:  # noqa: BLE001 - outside a run
            self.id = None

    def update(self, step: int, max_steps: int, metrics: dict[str, Any] | None = None) -> None:
        pct = 100.0 * step / max(1, max_steps)
        fresh = {k: v for k, v in (metrics or {}).items() if k in self.HELDOUT}
        if fresh:  # a held-out evaluation: shown now and with every update until the next one
            self.heldout = {**fresh, "eval_step": step}
        if self.id is None or (pct - self.last < 1.0 and step < max_steps and not fresh):
            return
        self.last = pct
        try:
            from prefect.client.schemas.actions import ArtifactUpdate

            shown = {k: _fmt(v) for k, v in {**(metrics or {}), **self.heldout}.items()
                     if k in self.SHOWN + self.HELDOUT or k == "eval_step"}
            self.client.update_artifact(artifact_id=self.id, artifact=ArtifactUpdate(
                data=min(100.0, max(0.0, pct)), description=f"step {step}/{max_steps} {shown}"))
        except Exception:  # noqa: BLE001
            pass


@dataclass
class StageContext:
    """A stage task's world: the config, the run, the store, its table entry (name, kind, section, what it starts
    from), the name its output has in the store and a local scratch folder."""

    config: PipelineConfig
    run: str
    store: Store
    entry: Stage
    stage: str  # its output's name in the store: the entry's name (evaluation's: evaluate/<stage it scored>)
    work: Path
    fetched: dict[str, tuple[StageRef, str]] = field(default_factory=dict)  # local path -> (output, name)

    @classmethod
    def open(cls, config: PipelineConfig, run: str, store: str | None, entry: Stage | str,
             output: str | None = None) -> "StageContext":
        """The context of ``entry`` (an entry or its name) committing as ``output`` (default: the entry's name)."""
        entry = entry if isinstance(entry, Stage) else get_entry(entry)
        stage = output or entry.name
        cfg, st = config, Store(store)
        base = Path(os.environ.get("R1_WORKDIR") or Path(tempfile.gettempdir()) / "r1-work")
        work = new_scratch(base, run, stage)  # fresh per attempt; those of dead processes removed (tasks/storage/scratch.py)
        if cfg.run.torch_num_threads:
            import torch

            torch.set_num_threads(cfg.run.torch_num_threads)
        return cls(cfg, run, st, entry, stage, work)

    @property
    def section(self) -> Any:
        """The entry's config section in this run's config."""
        return self.entry.section_of(self.config)

    def __enter__(self) -> "StageContext":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.cleanup()  # the scratch folder goes whatever happened: a retry reads from the store

    def reuse(self, fp: str, force: bool) -> StageRef | None:
        return None if force else self.store.latest(self.run, self.stage, fp)

    def fetch(self, ref: StageRef, name: str) -> Path:
        """Download ``name`` of an upstream output (a file such as ``train.parquet``, or a folder such as
        ``model``) into the scratch folder, resolved in this stage's store and checked file by file against
        the output's manifest (size and sha256). A mismatch fails the stage without a retry."""
        dest = self.work / "inputs" / ref.stage / name
        try:
            path = self.store.get_output(ref, name, dest)
            self.fetched[str(path)] = (ref, name)  # other nodes of a multi-node stage fetch the same
            return path
        except IntegrityError as e:
            raise StageFailed(f"{self.stage}: upstream {ref.stage} output is not what was committed: {e}") from None

    def base_model(self, data: StageRef) -> str:
        """Local folder of the base model (the tiny one built by prepare_data) or its hub name."""
        if self.config.model.tiny is not None:
            return str(self.fetch(data, "base_model"))
        return str(self.config.model.name_or_path)

    def init_model(self, parents: dict[str, StageRef]) -> str:
        """Local folder of the model this stage starts from: the committed model of the stage its entry's
        ``init_from`` names (one of ``parents``)."""
        if not self.entry.init_from:
            raise StageFailed(f"{self.stage}: its table entry names no stage to start from; set init_from on it")
        return str(self.fetch(parents[self.entry.init_from], "model"))

    def begin(self, version: str | None = None) -> StageWriter:
        return self.store.begin(self.run, self.stage, version)

    def cleanup(self) -> None:
        shutil.rmtree(self.work, ignore_errors=True)


def commit_stage(ctx: StageContext, writer: StageWriter, *, fp: str, parents: dict[str, StageRef],
                 metrics: dict[str, Any], section: BaseModel | None = None,
                 extra: dict[str, Any] | None = None) -> StageRef:
    """Commit (manifest last) with ``section`` (default: the stage's own) as its config, publish the metrics table,
    log the URI."""
    section = ctx.section if section is None else section
    numeric = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
    ref = writer.commit(fingerprint=fp, config={ctx.stage: section.model_dump(mode="json"),
                                                "model": ctx.config.model.model_dump(mode="json")},
                        parents=parents, metrics=numeric, extra=extra)
    publish_metrics(ctx.run, ctx.stage, ref, numeric)
    logger().info(f"{ctx.stage}: committed {ref.uri}")
    return ref


def write_jsonl(rows: list[dict[str, Any]], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rows:
            f.write(json.dumps(r, default=str) + "\n")
    return path


def resolve_reward_models(ctx: StageContext, section: BaseModel, parents: dict[str, StageRef]) -> BaseModel:
    """A copy of ``section`` whose ``model: reward_model`` entries (``reward_funcs``, ``sources[*].reward_funcs``,
    ``rm_reward``) name the local folder of the committed reward_model output in ``parents`` (fetched and checked
    against its manifest)."""
    if not uses_reward_model_stage(section):
        return section
    if REWARD_MODEL_STAGE not in parents:
        raise StageFailed(f"{ctx.stage}: a reward names the reward_model stage but it is not among this stage's "
                          "inputs; give its entry in tasks/config/stages.py the reward_fields of its section (an entry "
                          "with reward fields reads the stage its rewards name: Stage.inputs)")
    return replace_stage_references(section, str(ctx.fetch(parents[REWARD_MODEL_STAGE], "model")))
