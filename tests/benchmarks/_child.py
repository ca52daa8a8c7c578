"""What the benchmarks that run work in child processes share: how a child is launched and read, and how a
benchmark whose runs failed ends.

Imported by the scripts beside it (run as scripts, so this folder is on sys.path). ``launch``: a child is the
same script run as ``SCRIPT --child SPEC`` with ``spec["threads"]`` threads, offline, this checkout on its path;
it prints one line ``RESULT {json}``. ``run_json``: any command whose last stdout line is JSON. ``exit_if_failed``:
a benchmark with a failed run exits 1 naming each, never 0 with a summary that lacks its headline number.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

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
    return {"error": f"exit {proc.returncode}: {_tail(proc.stderr)}"}


def run_json(cmd: Sequence[str], env: Mapping[str, str] | None = None, what: str = "child") -> dict[str, Any]:
    """The JSON object on ``cmd``'s last stdout line; exits 1 with its stderr's tail if it fails or prints none."""
    proc = subprocess.run(list(cmd), env=dict(env) if env is not None else None, capture_output=True, text=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode == 0 and lines:
        try:
            return json.loads(lines[-1])
        except json.JSONDecodeError:
            pass
    sys.exit(f"{what} failed (exit {proc.returncode}): {_tail(proc.stderr, 12)}")


def exit_if_failed(failed: Mapping[str, str]) -> None:
    """Exit 1 naming every failed run and why (call it after printing what did run): a benchmark whose runs
    failed must not pass for one that measured."""
    if failed:
        sys.exit("benchmark FAILED, its numbers are incomplete: "
                 + "; ".join(f"{name}: {why}" for name, why in failed.items()))


def _tail(stderr: str, lines: int = 3) -> str:
    tail = [line for line in stderr.strip().splitlines() if line.strip()][-lines:]
    return " | ".join(tail)[-600 * max(1, lines // 3):]
