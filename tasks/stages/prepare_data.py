"""Stage 1, prepare_data: normalised train/eval prompt sets, the cold-start SFT set, and (for the embedded
default) the tiny base model, written as parquet + a model folder and committed to the store.

Output files: ``train.parquet``, ``eval.parquet``, ``cold_start.parquet``, ``preferences.parquet`` (preference
pairs ``{prompt, chosen, rejected, source}`` of the built-in general sources; only when there are pairs),
``base_model/`` (tiny only; pretrained on the built-in task's worked solutions when ``model.tiny.pretrain``
is set). Every prompt row keeps its ``source`` column.
A bad row fails the stage before anything is written (grpo_core.data.rows.DataError names file, row, field),
unless ``data.on_error: skip``, which counts the skipped rows in the manifest.

A teacher cold-start source may name a committed model of a run in this store instead of a folder,
``model: run:RUN/STAGE`` (e.g. ``run:r1-zero/grpo_train``: R1-Zero-style outputs made readable): that output
is a parent of this stage (in its fingerprint and manifest) and is fetched, verified, before sampling.
The fingerprint also holds the content of the local data files the sources name and the cached revision of hub
data sets (tasks/storage/data_inputs.py): a file edited in place is a new fingerprint, not a reused output.
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import TeacherSource
from grpo_core.data.rows import write_parquet
from grpo_core.recipe.prepare import prepare_datasets
from tasks.config.pipeline import PipelineConfig
from tasks.runner.common import StageContext, StageFailed, commit_stage, stage_task
from tasks.storage import lineage
from tasks.storage.data_inputs import data_inputs
from tasks.storage.manifest import StageRef

RUN_REF = "run:"


def teacher_refs(config: PipelineConfig, store: Any) -> dict[str, StageRef]:
    """``{"teacher:run:RUN/STAGE": ref}``: the committed outputs the teacher sources name (each run's current one,
    tasks/storage/lineage.py)."""
    out = {}
    for j, src in enumerate(config.data.cold_start_sources):
        if not (isinstance(src, TeacherSource) and src.model.startswith(RUN_REF)):
            continue
        run, _, stage = src.model[len(RUN_REF):].partition("/")
        ref = lineage.current(store, run, stage) if run and stage else None
        if ref is None:
            raise StageFailed(f"data.cold_start_sources[{j}].model {src.model!r}: no committed {stage or 'STAGE'!r} "
                              f"output of run {run or 'RUN'!r} in {store.url}; run that stage first, or name a model "
                              "folder (the form is run:RUN/STAGE, e.g. run:r1-zero/grpo_train)")
        out[f"teacher:{src.model}"] = ref
    return out


@stage_task("prepare_data", section="data", key_model=True, referenced=teacher_refs,
            fingerprint_inputs=lambda config: data_inputs(config.data))
def prepare_data(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    cfg = ctx.config
    local = {src.model: str(ctx.fetch(parents[f"teacher:{src.model}"], "model")) for src in cfg.data.cold_start_sources
             if isinstance(src, TeacherSource) and src.model.startswith(RUN_REF)}
    sources = [src.model_copy(update={"model": local[src.model]}) if isinstance(src, TeacherSource) and src.model in local
               else src for src in cfg.data.cold_start_sources]
    data = prepare_datasets(cfg.data.model_copy(update={"cold_start_sources": sources}))
    for name, path in local.items():  # rows and stats name the reference, not the scratch folder it was fetched to
        data.stats["sources"][f"cold_start:teacher:{name}"] = data.stats["sources"].pop(f"cold_start:teacher:{path}")
        for row in data.cold_start:
            if row.get("source") == f"teacher:{path}":
                row["source"] = f"teacher:{name}"
    out = ctx.work / "out"
    write_parquet(data.train, out / "train.parquet")
    write_parquet(data.eval, out / "eval.parquet")
    write_parquet(data.cold_start, out / "cold_start.parquet")
    if data.preferences:  # the reward_model stage reads it, and says so when it is missing
        write_parquet(data.preferences, out / "preferences.parquet")
    pretrain: dict[str, float] = {}
    if cfg.model.tiny is not None:
        # heavy import (torch, transformers): only the embedded default builds a model
        from grpo_core.models.tiny import build_tiny_model
        from grpo_core.recipe.pretrain import pretrain_tiny_model

        build_tiny_model(out / "base_model", **cfg.model.tiny.architecture())
        if cfg.model.tiny.pretrain is not None:
            result = pretrain_tiny_model(out / "base_model", data.pretrain, cfg.model.tiny.pretrain, ctx.work / "pretrain")
            pretrain = {f"pretrain/{k.split('/')[-1]}": v for k, v in result.items()}
    with ctx.begin() as writer:
        writer.put_dir(out)
        metrics = {**pretrain, "data/num_train": len(data.train), "data/num_eval": len(data.eval),
                   "data/num_cold_start": len(data.cold_start), "data/num_preferences": len(data.preferences),
                   **{f"data/{source}/num_train": n for source, n in data.stats["train_by_source"].items()}}
        return commit_stage(ctx, writer, fp=fp, section=cfg.data, parents=parents, metrics=metrics,
                            extra={"data_stats": data.stats})


def check_source_rows(ctx: StageContext, section: Any, data: StageRef) -> None:
    """Fail an RL stage before it loads anything when one of its ``sources`` has no training rows in ``data``
    (prepare_data's output), naming what prepare_data did with that source's rows."""
    missing = [s.name for s in getattr(section, "sources", []) if not data.metrics.get(f"data/{s.name}/num_train")]
    if not missing:
        return
    stats = ctx.store.manifest(data).get("data_stats", {})
    present = ", ".join(sorted(stats.get("train_by_source", {}))) or "none"
    causes = []
    for name in missing:
        dropped = stats.get("train_contaminated_by_source", {}).get(name)
        causes.append(
            f"source {name!r}: prepare_data's decontamination dropped all {dropped['of']} of its rows (they share "
            f"{stats.get('ngram_size', 'n')}-word runs with eval prompts, e.g. {dropped['example_ngram']!r}); see "
            "data.ngram_size / data.decontaminate and rerun prepare_data" if dropped else
            f"source {name!r}: prepare_data wrote no rows with this source (the train sources are: {present}); fix "
            f"{ctx.stage}.sources[].name or the data source's `source:`")
    raise StageFailed(f"{ctx.stage}: " + "; ".join(causes) + f" ({data.uri})")
