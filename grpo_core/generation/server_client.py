"""The trainer's sampler under ``sampling.vllm_mode: server``: rollouts from a generation server over HTTP.

``ServerBackend`` implements the interface of the other samplers (``generate``, ``update_weights``,
``probe_logprobs``, ``weights_digest``, ``close``) against ``grpo_core.generation.serve``. Every call is bounded
by ``vllm_server_timeout``: a refused connection is retried (0.5 s apart) until the deadline, a read that outlasts
it fails, and a server the stage started that has exited fails at once with its exit code and log; each error
names the URL and what to do. Requests are idempotent (completions carry their seeds; a weight push restarts
under a new id), so a retry never changes a result.

Seeds are drawn on the trainer's side (``resolve_seeds``), so a completion depends on (seed, step, position, j)
and the weights, as with the colocated engine; the server returns the sampler's log-probs, so the
importance-sampling correction (``vllm_importance_sampling_correction``) acts as in colocate mode.

Weights: the policy's state dict (HF names; DDP/FSDP wrappers unwrapped) is cast to the server's dtype and sent as
safetensors blobs of at most ``chunk_bytes`` (a tensor larger than that travels alone), then loaded together.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from grpo_core.generation.base import GenerationRequest, Rollout
from grpo_core.generation.server_process import ServerProcess
from grpo_core.generation.vllm_backend import full_state_items

CHUNK_BYTES = 64 * 2**20
RETRY_INTERVAL = 0.5


class VLLMServerError(RuntimeError):
    """The generation server did not answer, answered an error, or exited."""


class ServerBackend:
    """A sampler whose engine is the server at ``base_url``; ``process``: the server when this stage started it."""

    batches_itself = True  # the server's engine schedules its own batches (see VLLMBackend)

    def __init__(self, base_url: str, *, timeout: float, process: ServerProcess | None = None,
                 chunk_bytes: int = CHUNK_BYTES) -> None:
        import requests

        self.base_url, self.timeout, self.process, self.chunk_bytes = base_url.rstrip("/"), timeout, process, chunk_bytes
        self.session = requests.Session()
        self._request("GET", "/health", doing="waiting for the server to start")
        info = self._request("GET", "/info", doing="reading the server's settings")
        self.dtype = getattr(torch, info["dtype"])
        self.server_pid = info.get("pid")

    # --- the sampler interface ---

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        request = request.seeded(len(prompt_ids))
        seeds, n = request.seeds, request.n
        body = {"prompt_ids": [list(map(int, p)) for p in prompt_ids], **request.to_dict()}
        out = self._request("POST", "/generate", json=body, doing=f"generating {len(seeds)} completions")["rollouts"]
        if len(out) != len(seeds):
            raise VLLMServerError(f"the vLLM server at {self.base_url} returned {len(out)} completions for "
                                  f"{len(seeds)} requested")
        return [Rollout(list(prompt_ids[i // n]), r["completion_ids"], r["logprobs"], truncated=r["truncated"],
                        text=r["text"], tool_mask=r.get("tool_mask")) for i, r in enumerate(out)]

    def update_weights(self, model: torch.nn.Module) -> None:
        """Send ``model``'s weights in chunks, then have the server load them all (and drop its prefix cache)."""
        push = self.start_push()
        for name, tensor in full_state_items(model):
            push.add(name, tensor)
        push.finish()

    def start_push(self) -> WeightPush:
        """A weight push begun on the server, fed tensor by tensor (``trainer/server_ranks.py`` walks a sharded
        model's state in lockstep with the other ranks between two ``add``)."""
        started = self._request("POST", "/update_weights/start", doing="starting a weight push")
        return WeightPush(self, started["update_id"])

    def reset_prefix_cache(self) -> None:
        self._request("POST", "/reset_prefix_cache", doing="resetting the prefix cache")

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        return self._request("POST", "/probe_logprobs", json={"token_ids": list(map(int, token_ids))},
                             doing="probing log-probs (weight-sync check)")["logprobs"]

    def weights_digest(self, names: list[str]) -> dict[str, tuple[str, str]]:
        held = self._request("POST", "/weights_digest", json={"names": list(names)},
                             doing="hashing weights (weight-sync check)")["digests"]
        return {k: (v[0], v[1]) for k, v in held.items()}

    def close(self) -> None:
        """Stop the server if this stage started it (an external server keeps running)."""
        self.session.close()
        if self.process is not None:
            self.process.stop()

    # --- transport ---

    def _request(self, method: str, path: str, *, doing: str, **kwargs: Any) -> Any:
        """One call, retried on refused connections until ``timeout`` seconds have passed since it began."""
        import requests

        url, deadline, last = self.base_url + path, time.monotonic() + self.timeout, ""
        while True:
            self._check_process(doing)
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                response = self.session.request(method, url, timeout=(min(5.0, left), left), **kwargs)
            except requests.exceptions.ReadTimeout:
                last = f"no answer within {self.timeout:g} s"
                break
            except requests.exceptions.ConnectionError as exc:  # refused / reset: not (yet) listening
                last = f"{type(exc).__name__}: {exc}"
                time.sleep(min(RETRY_INTERVAL, max(0.0, deadline - time.monotonic())))
                continue
            if response.status_code >= 400:
                detail = _detail(response)
                raise VLLMServerError(f"the vLLM server at {self.base_url} refused {method} {path} while {doing} "
                                      f"(HTTP {response.status_code}): {detail}")
            return response.json()
        self._check_process(doing)
        where = f"; its log: {self.process.log_path}" if self.process is not None else ""
        raise VLLMServerError(
            f"the vLLM server at {self.base_url} did not answer {method} {path} while {doing} within "
            f"sampling.vllm_server_timeout={self.timeout:g} s ({last}){where}. Check that the server is running and "
            "reachable (python -m grpo_core.generation.serve --model PATH --port N), restart it if it died, and "
            "rerun the stage: it resumes from its last checkpoint. A slow but healthy server: raise "
            "sampling.vllm_server_timeout")

    def _check_process(self, doing: str) -> None:
        if self.process is None or self.process.exit_code() is None:
            return
        raise VLLMServerError(
            f"the vLLM server at {self.base_url} (pid {self.process.pid}, started by this stage) exited with code "
            f"{self.process.exit_code()} while {doing}; its log: {self.process.log_path}. Rerun the stage: it starts "
            f"a new server and resumes from its last checkpoint. Last log lines:\n{self.process.log_tail()}")


class WeightPush:
    """One push in progress: ``add`` each tensor (cast to the server's dtype, sent in blobs of at most
    ``client.chunk_bytes``), then ``finish`` has the server load them all."""

    def __init__(self, client: ServerBackend, update_id: str) -> None:
        self.client, self.update_id = client, update_id
        self.chunk: dict[str, torch.Tensor] = {}
        self.size = self.sent = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if tensor.is_floating_point():
            tensor = tensor.to(self.client.dtype)
        tensor = tensor.detach().to("cpu").contiguous().clone()  # clone: tied weights share storage
        nbytes = tensor.numel() * tensor.element_size()
        if self.chunk and self.size + nbytes > self.client.chunk_bytes:
            self._flush()
        self.chunk[name], self.size, self.sent = tensor, self.size + nbytes, self.sent + 1

    def finish(self) -> None:
        self._flush()
        self.client._request("POST", "/update_weights/finish", json={"update_id": self.update_id,
                                                                     "num_tensors": self.sent},
                             doing="loading the pushed weights")

    def _flush(self) -> None:
        from safetensors.torch import save

        if self.chunk:
            self.client._request("POST", "/update_weights/chunk", params={"update_id": self.update_id},
                                 data=save(self.chunk), doing=f"pushing weights ({len(self.chunk)} tensors)")
        self.chunk, self.size = {}, 0


def _detail(response: Any) -> str:
    try:
        return str(response.json().get("detail", response.text))
    except ValueError:
        return response.text[:500]


def connect_server(sampling: Any, model_path: str, *, log_dir: Path, opts: dict[str, Any]) -> ServerBackend:
    """The sampler of ``sampling`` (a ``GRPOSampling`` in server mode): the running server at
    ``vllm_server_base_url``, or one started here on ``model_path`` (log: ``log_dir/vllm_server.log``; ``opts``:
    the engine settings ``backend_options`` gives)."""
    if sampling.vllm_server_base_url is not None:
        return ServerBackend(sampling.vllm_server_base_url, timeout=sampling.vllm_server_timeout)
    process = ServerProcess(model_path, host=sampling.vllm_server_host, port=sampling.vllm_server_port,
                            log_path=Path(log_dir) / "vllm_server.log", devices=sampling.vllm_server_devices,
                            opts=opts)
    try:
        return ServerBackend(process.url, timeout=sampling.vllm_server_timeout, process=process)
    except BaseException:
        process.stop()
        raise
