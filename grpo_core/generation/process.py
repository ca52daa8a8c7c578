"""A generation backend in its own process: the sampler that asynchronous rollouts will run beside the trainer.

``ProcessBackend(kind, model_path, dtype=..., device=..., **opts)`` starts a child process (``spawn``) that builds
an ordinary backend (``make_backend(kind, model_path, **opts)``: transformers or vLLM) and serves requests over a
pipe, one at a time, in order. ``submit`` sends a generate request and returns at once; ``result`` waits for its
rollouts, so a caller can train while the sampler generates. ``generate`` is both (the ``GenerationBackend``
contract). ``last_timings``: the child's own seconds for the last result (``generate``, ``annotate``), for profiling.

Placement: the transformers child loads ``model_path`` in ``dtype`` (the trainer's, fp32, unless asked otherwise)
on ``device`` (the trainer's), never at the checkpoint's own dtype: a bf16 base and a resumed run's fp32
checkpoint then sample alike, so a resumed run repeats the uninterrupted one bit for bit. ``dtype`` / ``device``
report what the child holds. vLLM chooses its device itself (``dtype`` reaches it through ``opts``).

Weights move through shared memory, not files: the first ``update_weights(model)`` allocates one flat host
buffer per dtype (``share_memory_()``, floating tensors in the sampler's dtype) and sends it to the child once
over the pipe (torch passes the file descriptor); every push copies the module's tensors into it in place and
sends a ``load`` message, on which the child copies them into its model (vLLM: ``reload_weights``) and sets a
"buffer free" event. The next push waits for that event (bounded, like every wait), so the child never reads a
half-written buffer; nothing is written under the temporary folder. A GPU trainer's weights go device -> host
buffer -> the child's device (one host copy of the model in the sampler's dtype, reused every step).

Every wait is bounded by ``timeout`` seconds (``start_timeout`` while the child builds its backend): a child that
exits (killed, out of memory) or stops answering raises ``SamplerError`` naming the sampler process, its pid and
exit code, within ``timeout``, never a hang (``SamplerCrashed``, a ``SamplerError``: worth a retry of the stage).
An exception inside the child comes back as a plain ``SamplerError`` with its traceback (a retry would fail alike).

``annotate``: an object built in the parent and used in the child, whose ``load()`` runs once after the backend
is built and whose ``__call__(rollouts) -> rollouts`` runs on every request's rollouts before they are sent back
(the asynchronous trainer's ``ReferenceLogps``: the reference model's log-probs, computed beside the sampling).

``rollout``: like ``annotate``, built in the parent and ``load()``-ed in the child; a request submitted with
``rollout=True`` is answered by ``rollout(backend, prompt_ids, request) -> (rollouts, extra)`` instead of
``backend.generate`` (the asynchronous trainer's ``ToolRollouts``: multi-turn tool trajectories, run where the
sampler is, their tool counts in ``extra``); ``last_extra`` holds the last result's ``extra`` (None otherwise).

``cpus``: the CPU cores the child runs on (``os.sched_setaffinity``, set before it builds anything), so on one
CPU machine the sampler has a core of its own instead of time-sharing the trainer's.

The trainer's ``async_rollouts`` schedule (``grpo_core/trainer/async_rollouts.py``) is its user.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import os
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from grpo_core.generation import make_backend
from grpo_core.generation.base import GenerationRequest, Rollout
from grpo_core.generation.vllm_backend import TensorsModule

POLL_S = 0.2  # how often a wait checks that the child is alive


class SamplerError(RuntimeError):
    """The sampler process died, stalled past its timeout, or failed a request."""


class SamplerCrashed(SamplerError):
    """The sampler process exited (killed, out of memory) or stalled past its timeout: not a code error."""


@dataclass(frozen=True)
class Slot:
    """Where one named tensor lives in the shared buffers: ``buffers[group][offset:offset + numel]``."""

    name: str
    group: str  # the buffer's dtype, e.g. "torch.float32"
    offset: int
    shape: tuple[int, ...]

    def view(self, buffers: dict[str, torch.Tensor]) -> torch.Tensor:
        return buffers[self.group].narrow(0, self.offset, math.prod(self.shape)).view(self.shape)


class SharedWeights:
    """A module's tensors in shared host memory, one flat buffer per dtype, written in place at every push.

    Floating tensors are held in ``dtype`` (the sampler's: the cast happens in the parent's copy); others keep
    theirs. Tied tensors (one storage under two names, e.g. embeddings and LM head) are held once, under both
    names. An FSDP2-sharded module's tensors are gathered whole at each write (every rank must write at once)."""

    def __init__(self, state: dict[str, torch.Tensor], dtype: torch.dtype) -> None:
        self.dtype = dtype
        sizes: dict[str, int] = {}
        placed: dict[tuple[int, int, tuple[int, ...]], Slot] = {}  # storage, offset, shape -> its first slot
        self.slots: list[Slot] = []  # every name, as in the module's state_dict (vLLM picks the ones it loads)
        for name, t in state.items():
            local = t.to_local() if hasattr(t, "to_local") else t  # an FSDP2 DTensor: its shard names the storage
            key = (local.untyped_storage().data_ptr(), local.storage_offset(), tuple(t.shape))
            if key in placed:  # a tied tensor: a second name on the same place in the buffer
                self.slots.append(Slot(name, placed[key].group, placed[key].offset, tuple(t.shape)))
                continue
            group = str(dtype if t.is_floating_point() else t.dtype)
            placed[key] = Slot(name, group, sizes.get(group, 0), tuple(t.shape))
            self.slots.append(placed[key])
            sizes[group] = sizes.get(group, 0) + t.numel()
        self.buffers = {g: torch.empty(n, dtype=getattr(torch, g.removeprefix("torch."))).share_memory_()
                        for g, n in sizes.items()}

    def matches(self, state: dict[str, torch.Tensor]) -> bool:
        return all(s.name in state and tuple(state[s.name].shape) == s.shape for s in self.slots)

    @torch.no_grad()
    def write(self, state: dict[str, torch.Tensor]) -> None:
        for slot in self.slots:  # a tied tensor is copied twice, to the same place
            tensor = state[slot.name].detach()
            if hasattr(tensor, "full_tensor"):  # FSDP2: every rank gathers the whole tensor (a collective)
                tensor = tensor.full_tensor()
            slot.view(self.buffers).copy_(tensor)  # cast and device -> host in one copy


class ProcessBackend:
    """A ``kind`` ("hf" or "vllm") backend on ``model_path`` in a child process, holding its weights in ``dtype``
    on ``device`` (transformers; vLLM places itself); ``opts`` go to ``make_backend``."""

    def __init__(self, kind: str, model_path: str | Path, *, dtype: torch.dtype = torch.float32,
                 device: str | torch.device = "cpu", timeout: float = 600.0, start_timeout: float = 600.0,
                 torch_num_threads: int = 1, cpus: set[int] | None = None, annotate: Any = None,
                 rollout: Any = None, **opts: Any) -> None:
        self.kind, self.timeout = kind, float(timeout)
        self.batches_itself = kind == "vllm"
        self._shared: SharedWeights | None = None
        self._pending = 0  # generate requests sent and not yet answered
        self.last_timings: dict[str, float] = {}  # the child's seconds on the last result: generate (, annotate)
        self.last_extra: Any = None  # what ``rollout`` returned beside the last result's rollouts
        self.has_rollout = rollout is not None
        ctx = mp.get_context("spawn")  # a fresh interpreter: no forked torch threads or vLLM state
        self._conn, child = ctx.Pipe()
        self._free = ctx.Event()  # set by the child once it has copied the shared buffers (the next push may write)
        self._free.set()
        self.process = ctx.Process(target=_serve, args=(child, kind, str(model_path), str(dtype), str(device), opts,
                                                        torch_num_threads, cpus, annotate, rollout, self._free),
                                   name="r1-sampler", daemon=True)
        self.process.start()
        child.close()
        # the child answers once its backend is built (a vLLM engine: minutes), with what it holds
        held = self._receive("starting", start_timeout)
        self.dtype: torch.dtype = getattr(torch, held["dtype"].removeprefix("torch."))
        self.device: str = held["device"]

    def submit(self, prompt_ids: list[list[int]], request: GenerationRequest, *, rollout: bool = False) -> None:
        """Send a generate request (``rollout``: answered by the child's ``rollout``); its rollouts come from the
        next ``result``."""
        self._send(("generate", [list(p) for p in prompt_ids], request, rollout))
        self._pending += 1

    def result(self) -> list[Rollout]:
        """The rollouts of the oldest request not yet collected; waits at most ``timeout`` seconds."""
        if not self._pending:
            raise SamplerError("result() called with no generate request in flight; call submit() first")
        self._pending -= 1
        rollouts, self.last_timings, self.last_extra = self._receive("generating")
        return rollouts

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        self.submit(prompt_ids, request)
        return self.result()

    def generate_rollout(self, prompt_ids: list[list[int]], request: GenerationRequest) -> tuple[list[Rollout], Any]:
        """``(rollouts, extra)`` of the child's ``rollout`` function, now (``submit(rollout=True)`` and ``result``)."""
        self.submit(prompt_ids, request, rollout=True)
        return self.result(), self.last_extra

    def update_weights(self, model: torch.nn.Module) -> None:
        """Copy ``model``'s weights into the shared buffers the child loads before its next request (waits only
        until the child has taken the previous push, at most ``timeout`` seconds)."""
        while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):  # DDP wrapper
            model = model.module
        state = model.state_dict()
        if self._shared is None or not self._shared.matches(state):
            self._wait_free()
            self._shared = SharedWeights(state, self.dtype)
            self._send(("attach", self._shared.buffers, self._shared.slots))  # once: torch sends the descriptors
        self._wait_free()
        self._shared.write(state)
        self._free.clear()
        self._send(("load",))

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
        self._shared = None

    def _name(self) -> str:
        return f"sampler process (pid {self.process.pid}, {self.kind} backend)"

    def _check_alive(self, doing: str, deadline: float, timeout: float) -> None:
        if not self.process.is_alive():
            raise SamplerCrashed(f"{self._name()} exited with code {self.process.exitcode} while {doing}; "
                                 "see its log above (killed, or out of memory)")
        if time.monotonic() > deadline:
            self.process.kill()
            raise SamplerCrashed(f"{self._name()} gave no answer within {timeout:.0f} s while {doing}; "
                                 "it was killed (raise the sampler timeout if generation is this slow)")

    def _wait_free(self) -> None:
        """Wait until the child has copied the last push out of the shared buffers."""
        deadline = time.monotonic() + self.timeout
        while not self._free.wait(POLL_S):
            self._check_alive("loading pushed weights", deadline, self.timeout)

    def _send(self, message: tuple) -> None:
        try:
            if self.process.is_alive():
                self._conn.send(message)
                return
        except OSError:  # the child died between the check and the send (broken pipe, connection reset)
            self.process.join(timeout=POLL_S * 10)
            if self.process.is_alive():
                raise  # the send failed on this side, the child is fine: not a crash to retry
        raise SamplerCrashed(f"{self._name()} has exited (code {self.process.exitcode}); the stage cannot continue")

    def _receive(self, doing: str, timeout: float | None = None) -> Any:
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        while not self._conn.poll(POLL_S):
            self._check_alive(doing, deadline, timeout)
        try:
            status, payload = self._conn.recv()
        except (EOFError, OSError) as exc:  # the child died: its end of the pipe is closed or reset
            self.process.join(timeout=POLL_S * 10)
            raise SamplerCrashed(f"{self._name()} exited with code {self.process.exitcode} while {doing}; "
                                 "see its log above (killed, or out of memory)") from exc
        if status == "error":
            raise SamplerError(f"{self._name()} failed while {doing}:\n{payload}")
        return payload


def _serve(conn: Any, kind: str, model_path: str, dtype: str, device: str, opts: dict[str, Any], threads: int,
           cpus: set[int] | None, annotate: Any, rollout: Any, free: Any) -> None:
    """The child: build the backend (and ``annotate``'s state), then answer ``generate`` / ``attach`` / ``load``
    / ``close`` messages in order."""
    try:
        if cpus:  # before any thread pool exists: every thread the child starts inherits this mask
            os.sched_setaffinity(0, cpus)
        torch.set_num_threads(threads)

        model = None
        if kind == "hf":  # the trainer's dtype and device, not the checkpoint's own dtype
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype.removeprefix("torch.")))
            model = model.to(device).eval().requires_grad_(False)
        backend = make_backend(kind, model_path, model=model, **opts)
        for part in (annotate, rollout):
            if part is not None:
                part.load()
        held = ({"dtype": str(next(model.parameters()).dtype), "device": str(next(model.parameters()).device)}
                if model is not None else {"dtype": str(getattr(backend, "dtype", dtype)), "device": "vllm"})
        conn.send(("ok", held))
    except Exception:  # noqa: BLE001 - the parent reports it
        conn.send(("error", traceback.format_exc()))
        return
    load_error = None
    buffers: dict[str, torch.Tensor] = {}
    slots: list[Slot] = []
    while True:
        try:
            message = conn.recv()
        except EOFError:  # the parent is gone
            return
        if message[0] == "close":
            return
        try:
            if message[0] == "attach":
                buffers, slots = message[1], message[2]
            elif message[0] == "load":
                try:
                    _load_weights(backend, model, {s.name: s.view(buffers) for s in slots})
                finally:
                    free.set()  # the buffers are read: the parent may write the next push
            elif message[0] == "generate":
                if load_error is not None:
                    raise RuntimeError(f"loading weights failed:\n{load_error}")
                start = time.perf_counter()
                extra = None
                if message[3]:
                    if rollout is None:
                        raise RuntimeError("a request for the sampler's rollout function, but it was started "
                                           "without one (ProcessBackend(rollout=...))")
                    rollouts, extra = rollout(backend, message[1], message[2])
                else:
                    rollouts = backend.generate(message[1], message[2])
                timings = {"generate": time.perf_counter() - start}
                if annotate is not None:
                    start = time.perf_counter()
                    rollouts = annotate(rollouts)
                    timings["annotate"] = time.perf_counter() - start
                conn.send(("ok", (rollouts, timings, extra)))
        except Exception:  # noqa: BLE001 - the parent reports it
            if message[0] in ("attach", "load"):
                load_error = traceback.format_exc()  # answered on the next generate (loads send no reply)
            else:
                conn.send(("error", traceback.format_exc()))


@torch.no_grad()
def _load_weights(backend: Any, model: torch.nn.Module | None, tensors: dict[str, torch.Tensor]) -> None:
    if model is not None:  # transformers: the backend samples with this module
        params = model.state_dict()
        missing = set(tensors) - set(params)
        if missing:
            raise KeyError(f"pushed tensors the sampler's model does not have: {sorted(missing)[:5]}")
        for name, tensor in tensors.items():
            params[name].copy_(tensor)  # host -> the sampler's device, cast to its dtype
        backend.update_weights(model)
    else:  # vLLM: reload_weights takes (name, tensor) pairs (and copies them into the engine)
        backend.update_weights(TensorsModule(tensors))

