"""Which model a GRPO run returns (``select_checkpoint``), and the monitor's summary of the run.

``last`` (the default): ``output_dir/final``, the last step's weights, as always. ``heldout``: the evaluated
checkpoint whose held-out signal was best (``monitor.py``: ``best_evaluation``, kept in the trainer state as
``best_checkpoint`` so that neither local nor store pruning removes it), written as ``output_dir/selected`` in the
run's ``save_dtype`` with ``selection.json`` (which step, why, the scores); the result's ``final_path`` points at it.
When the best step is the last one, ``final`` is that model and nothing else is written.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from grpo_core.config import GRPOConfig
from grpo_core.trainer.checkpoint import write_json
from grpo_core.trainer.distributed import DistContext, barrier
from grpo_core.trainer.lora import load_lora_model
from grpo_core.trainer.monitor import ALARM, HELDOUT, PROXY, alarms_of, best_evaluation, metric, monitored_sources
from grpo_core.trainer.skeleton import TrainingRun, config_file, load_trained_model, resolve_save_dtype, save_final_model

logger = logging.getLogger(__name__)

SELECTED = "selected"
MONITOR_FILE = "monitor.json"
WHY = "the evaluated checkpoint with the highest held-out signal (mean over the monitored sources; ties: the earlier)"


def select_checkpoint(run: TrainingRun, config: GRPOConfig, ctx: DistContext, model_path: str | Path,
                      final: Path) -> dict[str, Any]:
    """``{}`` under ``select_checkpoint: last``; else ``monitor/selected_step``, ``monitor/selected_heldout``,
    ``monitor/last_heldout`` and ``final_path`` (the selected model's folder; module docstring)."""
    if config.select_checkpoint != "heldout":
        return {}
    history, last = run.state["log_history"], run.state["step"]
    best = run.state.get("best_checkpoint")
    if best is None:  # no evaluation ran (max_steps < eval_steps): nothing to select from
        logger.warning("select_checkpoint: heldout found no evaluation (max_steps %d < eval_steps %s): the last "
                       "step's model is returned", last, config.eval_steps)
        return {"monitor/selected_step": float(last), "final_path": str(final)}
    step, score = int(best["step"]), float(best["heldout"])
    evaluated = [r for r in history if any(k.startswith("monitor/") and k.endswith("/" + HELDOUT) for k in r)]
    last_eval = best_evaluation(evaluated[-1:])  # the last evaluation's held-out signal
    out = {"monitor/selected_step": float(step), "monitor/selected_heldout": score,
           "monitor/last_heldout": last_eval[1] if last_eval else math.nan}
    if step == last:
        return {**out, "final_path": str(final)}
    selected = run.output_dir / SELECTED
    if ctx.is_main:
        source = run.output_dir / f"checkpoint-{step}"
        logger.info("select_checkpoint: heldout: returning checkpoint-%d (held-out %.4g) instead of step %d's model "
                    "(held-out %.4g)", step, score, last, out["monitor/last_heldout"])
        model = load_checkpoint_model(source, config, ctx, model_path)
        record = {"select_checkpoint": "heldout", "step": step, "heldout": score, "last_step": last,
                  "last_heldout": out["monitor/last_heldout"],
                  "why": WHY}
        save_final_model(model, run.tokenizer, selected, dtype=resolve_save_dtype(config.save_dtype, model_path),
                         json_files={config_file("grpo"): run.config_json, "selection.json": record})
        del model
    barrier(ctx)
    return {**out, "final_path": str(selected)}


def load_checkpoint_model(path: Path, config: GRPOConfig, ctx: DistContext, model_path: str | Path) -> Any:
    """A checkpoint's model in this process alone (rank 0): full weights, or the base with the checkpoint's LoRA
    adapters (a LoRA checkpoint holds only those)."""
    if config.use_peft:
        return load_lora_model(model_path, config, ctx.device, adapter=path)
    alone = DistContext(rank=0, world_size=1, local_rank=ctx.local_rank, device=ctx.device)
    return load_trained_model(path, config, alone, trainable=False)


def finish_monitor(run: TrainingRun, config: GRPOConfig, signal_name: str, selection: dict[str, Any]
                   ) -> dict[str, float]:
    """Write ``output_dir/monitor.json`` (rank 0): the monitored sources, the held-out signal, every evaluation's
    numbers, the alarms (replayed from them with ``monitor_window``, so a resumed run lists those before the crash
    too) and the selection; return the alarms as numbers: ``monitor/alarms`` (evaluations that alarmed, over all
    sources) and ``monitor/{source}/first_alarm_step`` for each source that alarmed."""
    history = run.state["log_history"]
    sources = monitored_sources(history)
    alarms = alarms_of(history, config.monitor_window)
    out: dict[str, float] = {"monitor/alarms": float(len(alarms))}
    for source in sources:
        if steps := [a.step for a in alarms if a.source == source]:
            out[f"monitor/{source}/first_alarm_step"] = float(steps[0])
    if run.ctx.is_main:
        record = {
            "heldout_signal": signal_name, "sources": sources, "monitor_window": config.monitor_window,
            "evaluations": [{"step": int(r["step"]), **{s: {k: r[metric(s, k)] for k in (PROXY, HELDOUT, ALARM)}
                                                        for s in sources if metric(s, HELDOUT) in r}}
                            for r in history if any(metric(s, HELDOUT) in r for s in sources)],
            "alarms": [a.to_dict() for a in alarms],
            "select_checkpoint": config.select_checkpoint,
            "selected": ({"step": int(selection["monitor/selected_step"]), "heldout": selection.get("monitor/selected_heldout"),
                          "last_step": int(run.state["step"]), "last_heldout": selection.get("monitor/last_heldout"),
                          "why": WHY} if "monitor/selected_step" in selection else None),
        }
        write_json(run.output_dir / MONITOR_FILE, record)
    return out
