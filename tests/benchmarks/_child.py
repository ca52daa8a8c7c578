"""What the benchmarks that time work in fresh child processes share: how a child is launched and read.

Imported by ``grpo_vs_trl.py`` and ``async_vs_sync.py`` (run as scripts, so this folder is on sys.path). A child
is the same script run as ``SCRIPT --child SPEC`` with ``spec["threads"]`` threads, offline, this checkout on
its path; it prints one line ``RESULT {json}``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]


def launch(script: str, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The child's ``RESULT`` object, or ``{"error": ...}`` (timed out, or its exit code and last stderr lines)."""
    threads = str(spec["threads"])
    env = {
        **os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "OMP_WAIT_POLICY": "PASSIVE",
        "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
        "TOKENIZERS_PARALLELISM": "false", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "WANDB_MODE": "disabled",
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    try:
        proc = subprocess.run([sys.executable, script, "--child", json.dumps(spec)], env=env, cwd=REPO,
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    tail = [l for l in proc.stderr.strip().splitlines() if l.strip()][-3:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)[-600:]}
