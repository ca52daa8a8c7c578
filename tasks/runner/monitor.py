"""The reward-hacking monitor in the pipeline: its alarms as Prefect events, its record in the stage manifest.

The trainer (grpo_core/trainer/monitor.py) scores the held-out rows of the general sources with the training reward
(the proxy) and a held-out signal every ``eval_steps`` and calls ``on_alarm`` when the proxy rose while the held-out
signal fell; ``tasks.runner.worker`` relays that as an ``alarm`` event, and ``publish_alarm`` logs it and emits the
Prefect event ``r1.reward_hacking.alarm`` on the run's stage, so an automation can page someone or stop the run.
grpo_core never imports prefect: this module is where the alarm meets it.

At the commit the trainer's ``monitor.json`` (evaluations, alarms, the checkpoint ``select_checkpoint`` chose and
why) goes into the manifest as ``monitor`` and beside the model as a file; the numbers (``monitor/alarms``,
``monitor/{source}/first_alarm_step``, ``monitor/selected_step``, ...) are among the stage metrics ``r1 status`` and
the report read (``status_lines``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ALARM_EVENT = "r1.reward_hacking.alarm"
MONITOR_FILE = "monitor.json"  # grpo_core.trainer.selection.MONITOR_FILE (not imported: that pulls in torch)


def stage_resource(run: str, stage: str) -> dict[str, str]:
    """The Prefect resource an alarm concerns: the run's stage."""
    return {"prefect.resource.id": f"r1.run.{run}.{stage}", "prefect.resource.name": f"{run}/{stage}",
            "r1.run": run, "r1.stage": stage}


def publish_alarm(run: str, stage: str, alarm: dict[str, Any], log: Any) -> None:
    """Log ``alarm`` (the trainer's ``Alarm.to_dict``) as a warning and emit it as a Prefect event (a no-op where
    Prefect emits no events, e.g. outside a server; never fails the stage)."""
    log.warning(f"{stage}: reward hacking suspected on source {alarm['source']!r}: from step {alarm['first_step']} "
                f"to step {alarm['step']} the training reward (proxy) rose {alarm['proxy_first']:.4g} -> "
                f"{alarm['proxy_last']:.4g} while the held-out signal fell {alarm['heldout_first']:.4g} -> "
                f"{alarm['heldout_last']:.4g}")
    try:
        from prefect.events import emit_event

        emit_event(ALARM_EVENT, resource=stage_resource(run, stage),
                   payload={k: v for k, v in alarm.items() if k != "event"})
    except Exception as e:  # noqa: BLE001 - the warning above and the manifest carry the alarm either way
        log.warning(f"{stage}: could not emit the Prefect event {ALARM_EVENT}: {e}")


def read_record(out: Path) -> dict[str, Any] | None:
    """The trainer's ``monitor.json`` in ``out``, or None (no monitor ran)."""
    path = Path(out) / MONITOR_FILE
    return json.loads(path.read_text()) if path.exists() else None


def status_lines(stage: str, metrics: dict[str, float]) -> list[str]:
    """What ``r1 status`` and the report say of a stage's monitor, from its committed metrics: the alarms and the
    checkpoint committed under ``select_checkpoint: heldout``; [] for a stage without a monitor."""
    lines = []
    if metrics.get("monitor/alarms"):
        firsts = sorted((k.split("/")[1], int(v)) for k, v in metrics.items() if k.endswith("/first_alarm_step"))
        where = ", ".join(f"{source} from step {step}" for source, step in firsts)
        lines.append(f"{stage}: REWARD-HACKING ALARM ({int(metrics['monitor/alarms'])} evaluations: {where}): the "
                     f"training reward rose while the held-out signal fell; see the manifest's monitor record")
    if "monitor/selected_step" in metrics:
        lines.append(f"{stage}: committed checkpoint-{int(metrics['monitor/selected_step'])} (select_checkpoint: "
                     f"heldout; held-out {metrics.get('monitor/selected_heldout', float('nan')):.4g}, last evaluation "
                     f"{metrics.get('monitor/last_heldout', float('nan')):.4g})")
    return lines
