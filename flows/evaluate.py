"""``r1 eval``: the evaluate step on its own, for a committed stage of a run or a local model folder.

    r1 eval RUN/final_rl --benchmarks math500,gsm8k,aime24 -n 16 --k 1,4,16 [--store URL]
    r1 eval final_rl --run RUN --benchmarks math500=data/math500_test.json --limit 50
    r1 eval /models/DeepSeek-R1-Distill-Qwen-1.5B --benchmarks aime24 -n 64 --max-completion-length 32768 --vllm

A stage of a run: the pipeline's ``evaluate`` task with the run's saved config, its ``evaluate`` section
updated by the command's options; the result is committed as ``{run}/evaluate/{stage}/{version}`` (held-out
set and benchmarks), and ``r1 status`` / ``r1 report`` show it. A local folder: the benchmarks only (there is
no held-out set), written to ``--output`` as ``metrics.json`` and ``{benchmark}.jsonl``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prefect import flow

from flows.stages import call_task, committed, gather_inputs, resolve_config
from tasks.config.pipeline import PipelineConfig, check_run_name
from tasks.config.stages import evaluation, get_stage
from tasks.runner.common import StageFailed, configure_stage_logging, write_jsonl
from tasks.stages.evaluate import make_eval_backend
from tasks.storage.store import Store


@flow(name="evaluate", flow_run_name="{run}-evaluate-{stage}", log_prints=True, validate_parameters=False)
def evaluate_flow(run: str, stage: str, store: str | None = None, config: PipelineConfig | None = None,
                  force: bool = False) -> dict[str, Any]:
    """Evaluate ``run``'s current committed ``stage`` model (held-out set and ``config.evaluate.benchmarks``);
    ``config`` defaults to the run's saved config. Returns the evaluation's reference as a dict."""
    configure_stage_logging()
    check_run_name(run)
    if not get_stage(stage).makes_model:
        raise StageFailed(f"stage {stage!r} makes no model to evaluate; evaluate one of the model stages")
    st = Store(store)
    cfg = resolve_config(config, None, run, st)
    model, inputs = committed(st, run, stage), gather_inputs(evaluation(), cfg, st, run, {})
    ref = call_task(evaluation().task.with_options(retries=cfg.run.retries), cfg, run, st.url, model, inputs, force)
    return ref.to_dict()


def evaluate_folder(model_dir: str | Path, eval_config: Any, output: str | Path) -> dict[str, float]:
    """The benchmarks of ``eval_config`` on a local model folder; writes ``output/metrics.json`` and
    ``output/{benchmark}.jsonl``; returns the metrics."""
    # heavy import (torch): a folder is evaluated in a process that may not sample
    from grpo_core.evaluation.benchmarks import evaluate_benchmarks

    _, tokenizer, backend = make_eval_backend(eval_config, str(model_dir))
    metrics, results = evaluate_benchmarks(eval_config, model_dir, tokenizer=tokenizer, backend=backend)
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.json").write_text(json.dumps({"model": str(Path(model_dir).resolve()), "metrics": metrics,
                                                  "config": eval_config.model_dump(mode="json")}, indent=2))
    for name, rows in results.items():
        write_jsonl(rows, out / f"{name}.jsonl")
    return metrics
