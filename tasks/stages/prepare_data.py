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

from grpo_core.config import DataConfig, TeacherSource
from grpo_core.data.rows import write_parquet
from grpo_core.recipe.prepare import prepare_datasets
from tasks.runner.common import StageContext, StageFailed, commit_stage, stage_task
from tasks.storage import lineage
from tasks.storage.data_inputs import data_inputs
from tasks.storage.manifest import StageRef

RUN_REF = "run:"


def teacher_refs(data: DataConfig, store: Any) -> dict[str, StageRef]:
    """``{"teacher:run:RUN/STAGE": ref}``: the committed outputs the teacher sources of ``data`` (the stage's
    section) name (each run's current one, tasks/storage/lineage.py)."""
    out = {}
    for j, src in enumerate(data.cold_start_sources):
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


@stage_task(key_model=True, referenced=teacher_refs, fingerprint_inputs=data_inputs)
def prepare_data(ctx: StageContext, parents: dict[str, StageRef], fp: str) -> StageRef:
    cfg, section = ctx.config, ctx.section
    local = {src.model: str(ctx.fetch(parents[f"teacher:{src.model}"], "model")) for src in section.cold_start_sources
             if isinstance(src, TeacherSource) and src.model.startswith(RUN_REF)}
    sources = [src.model_copy(update={"model": local[src.model]}) if isinstance(src, TeacherSource) and src.model in local
               else src for src in section.cold_start_sources]
    data = prepare_datasets(section.model_copy(update={"cold_start_sources": sources}))
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
        return commit_stage(ctx, writer, fp=fp, parents=parents, metrics=metrics, extra={"data_stats": data.stats})

