"""Scratch folders: a stage attempt killed by kill -9 leaves its folder (inputs, a full checkpoint); the next
stage to start on this host removes it, and leaves a live writer's, another host's and unmarked folders."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tasks.config.pipeline import PipelineConfig
from tasks.runner.common import StageContext
from tasks.storage.owner import this_process
from tasks.storage.scratch import OWNER

ROOT = Path(__file__).resolve().parents[2]


def _killed_attempt(base: Path, stage: str) -> Path:
    """The scratch folder of a stage attempt in another process (``stage``: an entry's name, or evaluation's
    output ``evaluate/<stage>``), killed with SIGKILL mid-stage."""
    entry = stage.partition("/")[0]
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from tasks.runner.common import StageContext
        from tasks.config.pipeline import PipelineConfig
        ctx = StageContext.open(PipelineConfig(), "r", {str(base / "store")!r}, {entry!r}, {stage!r})
        (ctx.work / "train" / "out" / "checkpoint-2").mkdir(parents=True)
        (ctx.work / "train" / "out" / "checkpoint-2" / "model.safetensors").write_bytes(b"w" * 4096)
        print(ctx.work, flush=True)
        time.sleep(60)
    """)], cwd=ROOT, text=True, stdout=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT),
                                                              "R1_WORKDIR": str(base / "work")})
    work = Path(proc.stdout.readline().strip())
    proc.kill()
    proc.wait()
    assert (work / "train" / "out" / "checkpoint-2" / "model.safetensors").exists()
    return work


def test_the_next_stage_removes_scratch_folders_of_killed_attempts(tmp_path, monkeypatch):
    monkeypatch.setenv("R1_WORKDIR", str(tmp_path / "work"))
    live = StageContext.open(PipelineConfig(), "r", str(tmp_path / "store"), "prepare_data").work  # this process
    dead = [_killed_attempt(tmp_path, "grpo_train"), _killed_attempt(tmp_path, "evaluate/grpo_train")]
    assert dead[0].parent == tmp_path / "work" / "r" / "grpo_train" and dead[0].name.split("-")[0].isdigit()
    elsewhere = tmp_path / "work" / "r" / "sft_consolidate" / "4242-abcdef"
    elsewhere.mkdir(parents=True)
    (elsewhere / OWNER).write_text(json.dumps({**this_process(), "host": "other-host", "pid": 4242}))
    unmarked = tmp_path / "work" / "r" / "sft_consolidate" / "0a1b2c"  # older layout: no owner, left alone
    unmarked.mkdir()
    ctx = StageContext.open(PipelineConfig(), "r2", str(tmp_path / "store"), "grpo_train")
    assert not any(p.exists() for p in dead)
    assert live.exists() and elsewhere.exists() and unmarked.exists() and ctx.work.exists()
    ctx.cleanup()
    assert not ctx.work.exists()
