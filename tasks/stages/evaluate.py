"""evaluate: score a stage's model on the held-out set and the configured benchmarks; a committed output of
its own.

Held-out set: greedy accuracy, pass@1 over k samples, mean completion length, format rate and the rest of
grpo_core.evaluation.heldout's metrics (``eval/...``), per source too when the set has several
(``eval/{source}/accuracy``, computed there). Benchmarks (``evaluate.benchmarks``, grpo_core.evaluation.benchmarks): the
R1 protocol's ``eval/{benchmark}/pass@1``, ``pass@{k}``, ``maj@{k}`` and ``greedy``. With ``evaluate.sampling.tools``
every completion is a multi-turn trajectory with the tools' answers, and the tool use is reported beside accuracy
(``eval/tools/call_rate``, ``calls_per_response``, ``error_rate``, per source too; each ``results.jsonl`` row has its
``tool_calls``). The output lives at ``{run}/evaluate/{stage}/{version}/`` with ``results.jsonl`` (held-out, per
prompt), ``benchmarks/{name}.jsonl`` (per problem: samples, extracted answers, verdicts) and a manifest whose parents
are the model it scored and the eval set; the scored stage's own manifest is never touched (a committed manifest is
written once). The fingerprint (eval config + model version + eval set version + each benchmark's rows) makes a second
evaluation of the same model a cache hit. It is the stage table's evaluation entry (name, section, seed, reward fields,
its inputs: ``flows/stages.py`` hands it those its entry names) and runs through the same fingerprint / reuse / clean-up
as every stage (``tasks.runner.common.reuse_or_build``).
"""

from __future__ import annotations

from typing import Any

from grpo_core.config import REWARD_MODEL_STAGE, EvalConfig
from grpo_core.data.rows import read_parquet
from tasks.config.sections import uses_reward_model_stage
from tasks.config.stages import all_stages, evaluation, get_stage
from tasks.runner.common import (StageContext, commit_stage, logger, resolve_reward_models, reuse_or_build, stage_task_options,
                          write_jsonl)
from tasks.storage.manifest import StageRef


def output_name(stage: str) -> str:
    """Where the evaluations of ``stage``'s models are committed (a stage name for the store)."""
    return f"{evaluation().name}/{stage}"


@stage_task_options(evaluation().name)
def evaluate(config, run: str, store: str | None, model: StageRef, inputs: dict[str, StageRef],
             force: bool = False) -> StageRef:
    """Evaluate the model committed as ``model`` on the held-out rows of ``inputs``' prepare_data output
    (``eval.parquet``) and on the section's ``benchmarks``; ``inputs`` are the evaluation entry's
    (``Stage.inputs``). General rows are scored by ``rm_reward``, which may name the run's reward_model output
    (then one of ``inputs`` when there is one; a model evaluated before the reward model exists is evaluated
    without ``eval/rm_score``)."""
    entry = evaluation()
    with StageContext.open(config, run, store, entry, output_name(model.stage)) as ctx:
        use_vllm, why = eval_use_vllm(ctx.config, model.stage)
        ev = ctx.section  # the manifest records the sampler that was followed
        cfg = ev.model_copy(update={"sampling": ev.sampling.model_copy(update={"use_vllm": use_vllm})})
        parents = {"model": model, **inputs}
        if uses_reward_model_stage(cfg) and REWARD_MODEL_STAGE not in parents:
            logger().info(f"{ctx.stage}: no {REWARD_MODEL_STAGE} output yet; evaluated without eval/rm_score")
            cfg = cfg.model_copy(update={"rm_reward": None})
        benchmark_rows = load_benchmarks(cfg)
        extra = {"benchmarks": {name: _digest(rows) for name, rows in benchmark_rows.items()}} if benchmark_rows else None
        return reuse_or_build(ctx, entry.name, cfg, parents, extra, force,
                              lambda fp: _score(ctx, cfg, parents, fp, benchmark_rows, why),
                              why="this model was already evaluated with this config")


def _score(ctx: StageContext, cfg: Any, parents: dict[str, StageRef], fp: str,
           benchmark_rows: dict[str, list[dict[str, Any]]], why: str) -> StageRef:
    """Sample and score ``parents["model"]`` on the held-out rows and the benchmarks; commit the results."""
    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.evaluation.benchmarks import evaluate_benchmarks
    from grpo_core.evaluation.heldout import evaluate as evaluate_held_out

    model, data = parents["model"], parents["prepare_data"]
    rows = read_parquet(ctx.fetch(data, "eval.parquet"))
    model_path = str(ctx.fetch(model, "model"))
    scoring = resolve_reward_models(ctx, cfg, parents)  # `model: reward_model` -> the fetched folder
    module, tokenizer, backend = make_eval_backend(scoring, model_path, why=why)
    result = evaluate_held_out(scoring, module if module is not None else model_path, rows, tokenizer=tokenizer,
                               backend=backend, return_rows=True)
    held_out = result.pop("rows")  # per row, with its source (grpo_core.evaluation.heldout)
    metrics = {k: float(v) for k, v in result.items() if isinstance(v, (int, float))}
    out = ctx.work / "out"
    files = {"results.jsonl": write_jsonl(held_out, out / "results.jsonl")}
    if benchmark_rows:
        bench_metrics, bench_results = evaluate_benchmarks(cfg, model_path, tokenizer=tokenizer, backend=backend,
                                                           benchmark_rows=benchmark_rows)
        metrics.update(bench_metrics)
        for name, results in bench_results.items():
            files[f"benchmarks/{name}.jsonl"] = write_jsonl(results, out / "benchmarks" / f"{name}.jsonl")
    with ctx.begin() as writer:
        for name, path in files.items():
            writer.put_file(path, name)
        ref = commit_stage(ctx, writer, fp=fp, section=cfg, parents=parents, metrics=metrics)
    logger().info(f"{ctx.entry.name} {model.stage}: " + ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items())))
    return ref


def load_benchmarks(cfg: Any) -> dict[str, list[dict[str, Any]]]:
    """``{benchmark: rows}`` of ``cfg.benchmarks`` (the first ``cfg.limit`` problems of each)."""
    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.evaluation.benchmarks import load_benchmark, resolve_benchmark

    return {resolve_benchmark(b).benchmark: load_benchmark(b, cfg.limit) for b in cfg.benchmarks}


def _digest(rows: list[dict[str, Any]]) -> str:
    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.evaluation.benchmarks import rows_digest

    return rows_digest(rows)


def eval_use_vllm(config: Any, stage: str) -> tuple[bool | None, str]:
    """``(use_vllm, where it comes from)`` for evaluating ``stage``'s model under the pipeline ``config``.

    ``evaluate.sampling.use_vllm`` when set; unset (None), evaluation samples as the stage does: a stage that samples
    on its GPU (the table's ``samples_on_gpu``: grpo_train, final_rl) by its own section's ``sampling.use_vllm``, any
    other model stage (the SFT stages) by the first RL stage's (grpo_train), the sampler the run's RL uses on the
    same machines. None from there: vLLM where installed."""
    own = evaluation().config_key
    if (setting := evaluation().section_of(config).sampling.use_vllm) is not None:
        return setting, f"{own}.sampling.use_vllm"
    entry = get_stage(stage)
    sampler = entry if entry.samples_on_gpu else next(s for s in all_stages() if s.kind == "grpo")
    return (sampler.section_of(config).sampling.use_vllm,
            f"{own}.sampling.use_vllm unset, so {sampler.config_key}.sampling.use_vllm")


def eval_backend_kind(use_vllm: bool | None, why: str) -> tuple[str, str]:
    """``("vllm" | "hf", a line saying which sampler evaluation uses and why)``; ``why`` names the setting, e.g.
    ``evaluate.sampling.use_vllm unset, so grpo_train.sampling.use_vllm`` (``eval_use_vllm``)."""
    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.generation import backend_kind

    kind = backend_kind(use_vllm)
    setting = "unset: vLLM where installed" if use_vllm is None else str(use_vllm).lower()
    return kind, f"evaluation samples with {'vLLM' if kind == 'vllm' else 'transformers'} ({why}: {setting})"


def make_eval_backend(cfg: EvalConfig, model_path: str, why: str = "evaluate.sampling.use_vllm"
                      ) -> tuple[Any, Any, Any]:
    """``(module or None, tokenizer, backend)``: vLLM where ``cfg.sampling.use_vllm`` selects it (None: where
    installed), then the held-out set's forced-reasoning pass loads its own module; else transformers sampling with
    the model loaded once (on the GPU when there is one). Logs the choice; ``why`` names the setting
    ``cfg.sampling.use_vllm`` came from (the evaluate task resolves an unset one with ``eval_use_vllm`` first)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    # heavy import (torch): the flow process imports this module before any sampling
    from grpo_core.generation import backend_options, make_backend

    kind, line = eval_backend_kind(cfg.sampling.use_vllm, why)
    logger().info(line)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    opts = backend_options(cfg.sampling, kind, device, seed=cfg.seed, bf16=cfg.bf16,
                           model_config=AutoConfig.from_pretrained(model_path))
    if kind == "vllm":
        return None, tokenizer, make_backend("vllm", model_path, tokenizer=tokenizer, **opts)
    module = AutoModelForCausalLM.from_pretrained(model_path).to(device)
    return module, tokenizer, make_backend("hf", model_path, model=module, tokenizer=tokenizer, **opts)
