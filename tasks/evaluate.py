"""evaluate: score a stage's model on the held-out set and write the numbers into that stage's manifest.

Greedy accuracy, pass@1 over k samples, mean completion length and format rate (grpo_core.evaluation).
The metrics are merged into the evaluated stage's committed manifest under ``metrics`` (``eval/...``)
with the per-prompt results as ``eval/results.jsonl``; the manifest's ``eval.fingerprint`` (eval config +
model version + eval set version) makes a second evaluation of the same model a cache hit.
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import PipelineConfig
from grpo_core.data import read_parquet
from tasks._common import StageContext, cached, fingerprint, logger, publish_metrics, stage_task, write_jsonl
from tasks.store import StageRef, sha256_file

STAGE = "evaluate"


@stage_task(STAGE)
def evaluate(config: PipelineConfig | dict[str, Any], run: str, store: str | None, ref: StageRef, data: StageRef,
             force: bool = False) -> StageRef:
    ctx = StageContext.open(config, run, store, f"{ref.stage}-eval")
    try:
        cfg = ctx.config.evaluate
        fp = fingerprint(STAGE, cfg, {"model": ref, "prepare_data": data})
        manifest = ctx.store.manifest(ref)
        if not force and (manifest.get("eval") or {}).get("fingerprint") == fp:
            return cached(ref, "already evaluated with this config")
        from grpo_core.evaluation import evaluate_with_config

        rows = read_parquet(ctx.fetch(data, "eval.parquet"))
        result = evaluate_with_config(cfg, str(ctx.fetch(ref, "model")), rows, return_rows=True)
        per_row = result.pop("rows")
        metrics = {k: float(v) for k, v in result.items() if isinstance(v, (int, float))}
        results_path = write_jsonl(per_row, ctx.work / "eval" / "results.jsonl")
        ctx.store.put_file(results_path, f"{ref.uri}/eval/results.jsonl")
        files = {"eval/results.jsonl": {"sha256": sha256_file(results_path), "size": results_path.stat().st_size}}
        new_ref = ctx.store.update_manifest(ref, metrics=metrics, files=files,
                                            eval={"fingerprint": fp, "config": cfg.model_dump(mode="json"),
                                                  "eval_set": data.parent_entry()})
        publish_metrics(run, ref.stage, new_ref, metrics, title="eval")
        logger().info(f"evaluate {ref.stage}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
        return new_ref
    finally:
        ctx.cleanup()
