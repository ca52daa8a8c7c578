"""The generation server as a child of the stage (``sampling.vllm_mode: server`` without ``vllm_server_base_url``).

The stage starts ``python -m grpo_core.generation.serve`` on the policy's weights, its output appended to a log file
next to the stage's output (``vllm_server.log``), and stops it when the sampler closes, when the stage's process
exits (``weakref.finalize`` runs at interpreter exit) or dies (Linux: the child gets SIGTERM when its parent goes,
``PR_SET_PDEATHSIG``), so a failed stage leaves no server behind to hold the device or the port.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import weakref
from pathlib import Path
from typing import Any

import grpo_core

_PROJECT_ROOT = str(Path(grpo_core.__file__).resolve().parents[1])  # the child imports this same grpo_core


def free_port(host: str) -> int:
    """A port nothing listens on now (``vllm_server_port: 0``); the server binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def serve_command(model_path: str, host: str, port: int, opts: dict[str, Any]) -> list[str]:
    """The server's command line; ``opts``: ``dtype``, ``max_model_len``, ``gpu_memory_utilization``,
    ``kv_cache_memory_bytes``, ``seed`` (None values left out)."""
    cmd = [sys.executable, "-m", "grpo_core.generation.serve", "--model", model_path, "--host", host, "--port", str(port)]
    for key in ("dtype", "max_model_len", "gpu_memory_utilization", "kv_cache_memory_bytes", "seed"):
        if opts.get(key) is not None:
            cmd += [f"--{key.replace('_', '-')}", str(opts[key])]
    return cmd


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _stop(popen: subprocess.Popen, grace: float = 10.0) -> None:
    if popen.poll() is not None:
        return
    popen.terminate()
    try:
        popen.wait(grace)
    except subprocess.TimeoutExpired:
        popen.kill()
        popen.wait(grace)


class ServerProcess:
    """A running ``grpo_core.generation.serve`` child; ``url`` is where it listens once healthy."""

    def __init__(self, model_path: str, *, host: str, port: int, log_path: Path, devices: str | None = None,
                 opts: dict[str, Any] | None = None) -> None:
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        self.log_path = Path(log_path)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (_PROJECT_ROOT, env.get("PYTHONPATH")) if p)
        if devices is not None:
            env["CUDA_VISIBLE_DEVICES"] = devices
        cmd = serve_command(model_path, host, self.port, opts or {})
        with open(self.log_path, "ab") as log:
            log.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} starting: {' '.join(cmd)}\n".encode())
            log.flush()
            self.popen = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                          preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        self._finalizer = weakref.finalize(self, _stop, self.popen)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exit_code(self) -> int | None:
        """None while it runs."""
        return self.popen.poll()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s; waits for the exit (no zombie, no orphan)."""
        self._finalizer()
