"""A generation backend in its own process: the sampler that asynchronous rollouts will run beside the trainer.

``ProcessBackend(kind, model_path, **opts)`` starts a child process (``spawn``) that builds an ordinary backend
(``make_backend(kind, model_path, **opts)``: transformers or vLLM) and serves requests over a pipe, one at a
time, in order. ``submit`` sends a generate request and returns at once; ``result`` waits for its rollouts,
so a caller can train while the sampler generates. ``generate`` is both (the ``GenerationBackend`` contract).
``last_timings``: the child's own seconds for the last result (``generate``, ``annotate``), for profiling.

Weights move through a file: ``update_weights(model)`` writes the module's weights with safetensors into
``weights_dir`` (a temporary name, then an atomic rename) and tells the child, which loads them before its
next request and deletes the file. Every wait is bounded by ``timeout`` seconds (``start_timeout`` while the
child builds its backend): a child that exits (killed,
out of memory) or stops answering raises ``SamplerError`` naming the sampler process, its pid and exit code,
within ``timeout``, never a hang (``SamplerCrashed``, a ``SamplerError``: worth a retry of the stage). An
exception inside the child comes back as a plain ``SamplerError`` with its traceback (a retry would fail alike).

``annotate``: an object built in the parent and used in the child, whose ``load()`` runs once after the backend
is built and whose ``__call__(rollouts) -> rollouts`` runs on every request's rollouts before they are sent back
(the asynchronous trainer's ``ReferenceLogps``: the reference model's log-probs, computed beside the sampling).

``cpus``: the CPU cores the child runs on (``os.sched_setaffinity``, set before it builds anything), so on one
CPU machine the sampler has a core of its own instead of time-sharing the trainer's.

The trainer's ``async_rollouts`` schedule (``grpo_core/trainer/async_rollouts.py``) is its user.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from grpo_core.generation.base import Rollout

POLL_S = 0.2  # how often a wait checks that the child is alive


class SamplerError(RuntimeError):
    """The sampler process died, stalled past its timeout, or failed a request."""


class SamplerCrashed(SamplerError):
    """The sampler process exited (killed, out of memory) or stalled past its timeout: not a code error."""


class ProcessBackend:
    """A ``kind`` ("hf" or "vllm") backend on ``model_path`` in a child process; ``opts`` go to ``make_backend``."""

    def __init__(self, kind: str, model_path: str | Path, *, timeout: float = 600.0, start_timeout: float = 600.0,
                 weights_dir: str | Path | None = None, torch_num_threads: int = 1,
                 cpus: set[int] | None = None, annotate: Any = None, **opts: Any) -> None:
        self.kind, self.timeout = kind, float(timeout)
        self.batches_itself = kind == "vllm"
        self._own_dir = weights_dir is None
        self.weights_dir = Path(weights_dir or tempfile.mkdtemp(prefix="r1-sampler-"))
        self.weights_dir.mkdir(parents=True, exist_ok=True)
        self._version = 0
        self._pending = 0  # generate requests sent and not yet answered
        self.last_timings: dict[str, float] = {}  # the child's seconds on the last result: generate (, annotate)
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch threads or vLLM state
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(child, kind, str(model_path), opts, torch_num_threads, cpus, annotate),
                                   name="r1-sampler", daemon=True)
        self.process.start()
        child.close()
        self._receive("starting", start_timeout)  # the child answers once its backend is built (a vLLM engine: minutes)

    def submit(self, prompt_ids: list[list[int]], **kwargs: Any) -> None:
        """Send a generate request (the ``generate`` keywords); its rollouts come from the next ``result``."""
        self._send(("generate", [list(p) for p in prompt_ids], kwargs))
        self._pending += 1

    def result(self) -> list[Rollout]:
        """The rollouts of the oldest request not yet collected; waits at most ``timeout`` seconds."""
        if not self._pending:
            raise SamplerError("result() called with no generate request in flight; call submit() first")
        self._pending -= 1
        rollouts, self.last_timings = self._receive("generating")
        return rollouts

    def generate(self, prompt_ids: list[list[int]], **kwargs: Any) -> list[Rollout]:
        self.submit(prompt_ids, **kwargs)
        return self.result()

    def update_weights(self, model: torch.nn.Module) -> None:
        """Write ``model``'s weights to a file the child loads before its next request (does not wait)."""
        from safetensors.torch import save_model

        while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):  # DDP wrapper
            model = model.module
        self._version += 1
        path = self.weights_dir / f"weights-{self._version:06d}.safetensors"
        tmp = path.with_suffix(".tmp")
        save_model(model, str(tmp))  # handles tied embeddings (shared tensors)
        os.replace(tmp, path)
        self._send(("load", str(path)))

    def close(self) -> None:
        if self.process.is_alive():
            try:
                self._conn.send(("close",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=10)
        self._conn.close()
        if self._own_dir:
            for f in self.weights_dir.glob("*"):
                f.unlink(missing_ok=True)
            self.weights_dir.rmdir()

    def _name(self) -> str:
        return f"sampler process (pid {self.process.pid}, {self.kind} backend)"

    def _send(self, message: tuple) -> None:
        try:
            if self.process.is_alive():
                self._conn.send(message)
                return
        except OSError:  # the child died between the check and the send (broken pipe, connection reset)
            self.process.join(timeout=POLL_S * 10)
        raise SamplerCrashed(f"{self._name()} has exited (code {self.process.exitcode}); the stage cannot continue")

    def _receive(self, doing: str, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._conn.poll(POLL_S):
            if not self.process.is_alive():
                raise SamplerCrashed(f"{self._name()} exited with code {self.process.exitcode} while {doing}; "
                                     "see its log above (killed, or out of memory)")
            if time.monotonic() > deadline:
                self.process.kill()
                raise SamplerCrashed(f"{self._name()} gave no answer within {timeout:.0f} s while {doing}; "
                                     "it was killed (raise the sampler timeout if generation is this slow)")
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:  # the child died: its end of the pipe is closed or reset
            self.process.join(timeout=POLL_S * 10)
            raise SamplerCrashed(f"{self._name()} exited with code {self.process.exitcode} while {doing}; "
                                 "see its log above (killed, or out of memory)") from exc
        if status == "error":
            raise SamplerError(f"{self._name()} failed while {doing}:\n{payload}")
        return payload


def _serve(conn: Any, kind: str, model_path: str, opts: dict[str, Any], threads: int, cpus: set[int] | None,
           annotate: Any) -> None:
    """The child: build the backend (and ``annotate``'s state), then answer ``generate`` / ``load`` / ``close``
    messages in order."""
    try:
        if cpus:  # before any thread pool exists: every thread the child starts inherits this mask
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)
        from grpo_core.generation import make_backend

        model = None
        if kind == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path).eval()
        backend = make_backend(kind, model_path, model=model, **opts)
        if annotate is not None:
            annotate.load()
        conn.send(("ok", None))
    except Exception:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
        return
    load_error = None
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message[0] == "close":
            return
        try:
            if message[0] == "load":
                _load_weights(backend, model, message[1])
            elif message[0] == "generate":
                if load_error is not None:
                    raise RuntimeError(f"loading weights failed:\n{load_error}")
                start = time.perf_counter()
                rollouts = backend.generate(message[1], **message[2])
                timings = {"generate": time.perf_counter() - start}
                if annotate is not None:
                    start = time.perf_counter()
                    rollouts = annotate(rollouts)
                    timings["annotate"] = time.perf_counter() - start
                conn.send(("ok", (rollouts, timings)))
        except Exception:  # noqa: BLE001 - the parent reports it
            if message[0] == "load":
                load_error = traceback.format_exc()  # answered on the next generate (loads send no reply)
            else:
                conn.send(("error", traceback.format_exc()))


def _load_weights(backend: Any, model: torch.nn.Module | None, path: str) -> None:
    from safetensors.torch import load_file, load_model

    if model is not None:  # transformers: the backend samples with this module
        load_model(model, path)
        backend.update_weights(model)
    else:  # vLLM: reload_weights takes (name, tensor) pairs
        backend.update_weights(_StateDict(load_file(path)))
    os.unlink(path)


class _StateDict(torch.nn.Module):
    """A module whose ``state_dict`` is a loaded file (what ``VLLMBackend.update_weights`` iterates)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._tensors = tensors

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self._tensors
