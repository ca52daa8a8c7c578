"""``r1 eval``: a model or a run's model stage under the R1 paper's evaluation protocol (``grpo_core/evaluation/benchmarks.py``).

    r1 eval exp-1/final_rl --benchmarks math500,gsm8k,aime24 -n 16 --k 1,4,16
    r1 eval /models/my-r1 --benchmarks math500=data/math500.json --limit 50
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from flows.cli_common import (FORCE_UNLOCK, STORE_HELP, _config, _existing_run, _fail, _interruptible, _lease,
                              _prefect_api, _refuse_held_lease, _run_flow, _run_name, _short, _stage_entry, _store)
from grpo_core.config import EvalConfig
from tasks.runner.common import StageFailed, configure_stage_logging


def eval_model(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN_STAGE",
                                 help="RUN/STAGE (a committed model stage of a run), STAGE with --run, or a local model folder"),
    benchmarks: Optional[str] = typer.Option(None, "--benchmarks", "-b", help="comma-separated: math500, gsm8k, aime24, "
                                             "aime25, or NAME=FILE (a local copy in that benchmark's schema)"),
    num_generations: Optional[int] = typer.Option(None, "-n", "--num-generations",
                                                  help="samples per problem (pass@1 over n)"),
    k: Optional[str] = typer.Option(None, "--k", help="comma-separated k for pass@k and maj@k, e.g. 1,4,16 (each <= n)"),
    limit: Optional[int] = typer.Option(None, "--limit", help="first N problems of each benchmark"),
    max_completion_length: Optional[int] = typer.Option(None, "--max-completion-length",
                                                        help="new tokens per completion"),
    max_prompt_length: Optional[int] = typer.Option(None, "--max-prompt-length", help="longer prompts keep their last N tokens"),
    temperature: Optional[float] = typer.Option(None, "--temperature", help="default 0.6 (R1 protocol)"),
    top_p: Optional[float] = typer.Option(None, "--top-p", help="default 0.95 (R1 protocol)"),
    vllm: Optional[bool] = typer.Option(None, "--vllm/--no-vllm", help="sample with vLLM or transformers (default: "
                                        "evaluate.sampling.use_vllm; unset: as the evaluated stage samples, transformers "
                                        "for a model folder)"),
    run_name: Optional[str] = typer.Option(None, "--run", help="the run, when MODEL_OR_RUN_STAGE is a stage name"),
    config: Optional[Path] = typer.Option(None, "-c", "--config", help="its evaluate section is the base (default: "
                                          "the run's saved config; for a folder, the R1-protocol defaults)"),
    store: Optional[str] = typer.Option(None, "--store", help=STORE_HELP),
    output: Optional[Path] = typer.Option(None, "--output", help="model folder only: where results go (default ./r1-eval/NAME)"),
    force: bool = typer.Option(False, "--force", help="evaluate again even if this model was evaluated with this config"),
    force_unlock: bool = typer.Option(False, "--force-unlock", help=FORCE_UNLOCK),
    num_samples: Optional[int] = typer.Option(None, "--num-samples", hidden=True, help="older --num-generations"),
    max_new_tokens: Optional[int] = typer.Option(None, "--max-new-tokens", hidden=True,
                                                 help="older --max-completion-length"),
) -> None:
    """Evaluate a model under the R1 paper's protocol: pass@1 over n samples (temperature 0.6, top-p 0.95),
    pass@k, maj@k and greedy accuracy per benchmark. A run's stage gets a committed evaluation output that
    `r1 status` and `r1 report` show."""

    options = {"benchmarks": _benchmark_args(benchmarks), "k": _ints(k, "--k"), "limit": limit}
    options = {key: v for key, v in options.items() if v is not None}
    num_generations = _older_flag("--num-samples", num_samples, "--num-generations", num_generations)
    max_completion_length = _older_flag("--max-new-tokens", max_new_tokens, "--max-completion-length",
                                        max_completion_length)
    sampling = {"num_generations": num_generations, "max_completion_length": max_completion_length, "top_p": top_p,
                "max_prompt_length": max_prompt_length, "temperature": temperature, "use_vllm": vllm}
    options["sampling"] = {key: v for key, v in sampling.items() if v is not None}
    folder = Path(target)
    if folder.is_dir() and (folder / "config.json").is_file():
        base = _config(config).evaluate if config else EvalConfig()
        cfg = _eval_config(base, options)
        if not cfg.benchmarks:
            _fail("a model folder has no held-out set; name benchmarks with --benchmarks math500,gsm8k,...")
        # heavy import (prefect): the CLI starts without it
        from flows.evaluate import evaluate_folder
        from tasks.stages.evaluate import eval_backend_kind

        why = "--vllm/--no-vllm" if vllm is not None else "evaluate.sampling.use_vllm"
        if cfg.sampling.use_vllm is None:  # a folder is no stage whose sampling evaluation could follow
            cfg = _eval_config(cfg, {"sampling": {"use_vllm": False}})
            why = "a model folder with evaluate.sampling.use_vllm unset, so use_vllm"
        typer.echo(eval_backend_kind(cfg.sampling.use_vllm, why)[1])
        out = output or Path("r1-eval") / folder.resolve().name
        metrics = evaluate_folder(folder, cfg, out)
        for key, v in sorted(metrics.items()):
            typer.echo(f"{key:<40}{_short(v)}")
        typer.echo(f"results: {out}")
        return
    if folder.exists() or target.startswith((".", "/", "~")):
        _fail(f"{target} is not a model folder (no config.json there); give a saved model folder or RUN/STAGE")
    run_part, _, stage_part = target.rpartition("/")
    run_part = run_part or run_name
    if not run_part:
        _fail(f"{target!r} is neither a model folder (with config.json) nor RUN/STAGE; or give the run with --run")
    entry = _stage_entry(stage_part)
    if not entry.makes_model:
        _fail(f"stage {stage_part!r} makes no model; evaluate one of the model stages")
    _run_name(run_part)
    st = _store(store)
    _existing_run(st, run_part)
    _refuse_held_lease(st, run_part, force_unlock)  # in a second: before Prefect, torch and the API's server start
    # heavy import (prefect): the CLI starts without it
    from flows.stages import resolve_config

    try:
        pipeline = _config(config) if config else resolve_config(None, None, run_part, st)
    except StageFailed as e:
        _fail(str(e))
    pipeline = pipeline.model_copy(update={"evaluate": _eval_config(pipeline.evaluate, options)})
    # heavy import (prefect): the CLI starts without it
    from flows.evaluate import evaluate_flow

    configure_stage_logging()
    with _interruptible(), _prefect_api(), _lease(st, run_part, force_unlock):
        ref = _run_flow(evaluate_flow, run=run_part, stage=stage_part, store=st.url, config=pipeline, force=force)
    for key, v in sorted(ref["metrics"].items()):
        if key.startswith("eval/"):
            typer.echo(f"{key:<40}{_short(v)}")
    typer.echo(f"evaluate/{stage_part}: committed {st.uri_of(ref['path'])}")


def _older_flag(old: str, old_value: Optional[int], new: str, value: Optional[int]) -> Optional[int]:
    """``value``, or the older flag's value with a warning naming the new flag (read until the next release, as the
    older config names are: grpo_core.config.SAMPLING_RENAMES); both given and different is an error."""
    if old_value is None:
        return value
    if value is not None and value != old_value:
        _fail(f"{old} {old_value} and {new} {value} are both given; {old} is the older spelling of {new}: keep {new}")
    typer.echo(f"warning: {old} is now {new} (the older flag is read until the next release)", err=True)
    return old_value


def _benchmark_args(text: Optional[str]) -> Optional[list[Any]]:
    """``math500,gsm8k=FILE`` -> ``["math500", {"benchmark": "gsm8k", "path": "/abs/FILE"}]``."""
    if text is None:
        return None
    out: list[Any] = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        name, eq, path = item.partition("=")
        out.append({"benchmark": name.strip(), "path": str(Path(path.strip()).resolve())} if eq else name)
    return out


def _ints(text: Optional[str], flag: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        _fail(f"{flag} takes comma-separated integers, e.g. 1,4,16; got {text!r}")


def _eval_config(base: Any, options: dict[str, Any]) -> Any:
    """``base`` (an EvalConfig) with the command's options (``sampling``: a mapping merged into base's);
    an invalid combination fails in one line."""
    from pydantic import ValidationError


    data = base.model_dump(exclude_unset=True)
    sampling = {**data.get("sampling", {}), **options.get("sampling", {})}
    try:
        return EvalConfig.model_validate({**data, **options, "sampling": sampling})
    except ValidationError as e:
        err = e.errors()[0]
        _fail(f"evaluate options: {'.'.join(map(str, err['loc'])) or 'evaluate'}: {err['msg']}")
