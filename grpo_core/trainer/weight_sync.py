"""Push the policy's weights to the sampler after an update, and check the sampler holds them.

The most repeated complaint about LoRA in RL systems is adapters that never reach the generator (verl#7495: a
run sampled from the initial policy for two months; ROLL#436; trl#2698): nothing fails, the rewards just do
not move. So a LoRA run, a run whose rollouts come from a generation server (``sampling.vllm_mode: server``:
weights cross a network) and a colocated vLLM engine under sleep mode (level 2 discards its weights after each
generation: every wake reloads them) check every sync (``SyncCheck``, ``checks_every_sync``) and fail the step naming
the sync when the sampler's weights are not the trainer's (``WeightSyncError``):

- hash, where the sampler can read its tensors (the transformers replica; vLLM on GPU): the trainer hashes a
  few merged tensors (``probe_names``: the first and last adapted weight, ``o_proj`` / ``down_proj`` first, which
  vLLM never fuses) cast to the dtype the sampler holds them in, and compares the sampler's hashes. Exact.
- probe log-prob, where it cannot (vLLM's CPU backend repacks its linear weights into kernel buffers): the
  sampler's log-probs of a fixed token sequence (``PROBE_LENGTH`` tokens) against the trainer's (adapter on, no
  dropout). Their mean gap must be within ``PROBE_TOLERANCE`` (float noise of the sampler's dtype), and, where the
  update moved the trainer's probe by more than that, the sampler must be nearer the new probe than the last
  sync's (a missed update is caught even when it is small against the tolerance, once it is larger than noise).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor

from grpo_core.generation.base import tensor_digest
from grpo_core.trainer.lora import MergedWeights, is_peft_model, merged_state_dict

_PREFERRED = ("o_proj", "down_proj")  # never fused by vLLM


class WeightSyncError(RuntimeError):
    """The sampler's weights are not the trainer's after a sync."""


def probe_names(model: torch.nn.Module) -> list[str]:
    """The merged tensors the check compares: the first and last adapted weight (every linear weight without
    LoRA), ``o_proj``/``down_proj`` first."""
    if is_peft_model(model):
        from peft.tuners.lora import LoraLayer

        adapted = [name for name, m in model.get_base_model().named_modules() if isinstance(m, LoraLayer)]
    else:
        adapted = [name for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    preferred = [n for n in adapted if n.rsplit(".", 1)[-1] in _PREFERRED] or adapted
    return sorted({f"{preferred[0]}.weight", f"{preferred[-1]}.weight"})


def policy_tensors(model: torch.nn.Module, names: list[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` as the sampler should hold them: merged under LoRA, else the model's own, whole: an
    FSDP shard (a DTensor) is gathered, a collective every rank joins (each runs the check, in ``names`` order)."""
    if is_peft_model(model):
        return merged_state_dict(model, names)
    state = model.state_dict()
    return {n: state[n].full_tensor() if isinstance(state[n], DTensor) else state[n] for n in names}


def checks_every_sync(model: torch.nn.Module, vllm_mode: str, backend: Any) -> bool:
    """Whether every sync is checked (module docstring): a LoRA policy, a generation server, or a sampler whose
    sleep discards its weights (``VLLMBackend.sleep_mode``: GPU, ``vllm_enable_sleep_mode``)."""
    return is_peft_model(model) or vllm_mode == "server" or bool(getattr(backend, "sleep_mode", False))


def push_weights(backend: Any, model: torch.nn.Module) -> None:
    """Give the sampler the policy's current weights: the merged ones for a LoRA policy."""
    backend.update_weights(MergedWeights(model) if is_peft_model(model) else model)


PROBE_LENGTH = 24
PROBE_TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-3}  # mean |gap| in nats; half precision: below
HALF_PROBE_TOLERANCE = 5e-2


def probe_tokens(vocab_size: int) -> list[int]:
    """A fixed, spread-out token sequence (the same in every run)."""
    return [(7919 * (k + 1) + 13) % vocab_size for k in range(PROBE_LENGTH)]


@torch.no_grad()
def trainer_probe(model: torch.nn.Module, token_ids: list[int]) -> torch.Tensor:
    """``[T-1]`` the trainer's log-probs of ``token_ids`` (eval mode: no adapter dropout; no RNG drawn)."""
    was_training = model.training
    model.eval()
    try:
        device = next(p for p in model.parameters()).device
        ids = torch.tensor([token_ids], device=device)  # [1, T]
        logits = model(input_ids=ids).logits.float()[0, :-1]  # [T-1, V]: position t predicts token t+1
        return logits.log_softmax(-1).gather(-1, ids[0, 1:, None]).squeeze(-1).cpu()  # [T-1]
    finally:
        model.train(was_training)


class SyncCheck:
    """Checks each sync of one run; keeps the last verified probe (the stale-weights comparison needs it)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.names = probe_names(model)
        self.tokens = probe_tokens(model.config.vocab_size)
        self.last_probe: torch.Tensor | None = None

    def __call__(self, backend: Any, model: torch.nn.Module, sync: str) -> None:
        """Fail with ``WeightSyncError`` naming ``sync`` (e.g. "after step 12 (optimiser step 12)") unless the
        sampler holds ``model``'s merged weights."""
        digest = getattr(backend, "weights_digest", None)
        held = digest(self.names) if digest is not None else {}
        if set(held) == set(self.names):
            verify_digests(held, model, self.names, sync)
        elif hasattr(backend, "probe_logprobs"):
            self._verify_probe(backend, model, sync)
        else:
            raise WeightSyncError(f"the sampler {type(backend).__name__} can report neither its weights nor probe "
                                  f"log-probs, so the sync {sync} cannot be checked; use the transformers or vLLM "
                                  "sampler (async_rollouts is not supported with use_peft)")

    def _verify_probe(self, backend: Any, model: torch.nn.Module, sync: str) -> None:
        sampler = torch.tensor(backend.probe_logprobs(self.tokens))  # [T-1] (T: what fits the sampler's context)
        trainer = trainer_probe(model, self.tokens[: len(sampler) + 1])  # [T-1]
        half = getattr(backend, "dtype", torch.float32) not in PROBE_TOLERANCE
        tol = HALF_PROBE_TOLERANCE if half else PROBE_TOLERANCE[torch.float32]
        gap = float((sampler - trainer).abs().mean())
        last = self.last_probe
        moved = float((trainer - last).abs().mean()) if last is not None else 0.0
        stale = last is not None and moved > tol and float((sampler - last).abs().mean()) < gap
        if gap > tol or stale:
            raise WeightSyncError(
                f"weight sync {sync}: the sampler's log-probs of the probe sequence are {gap:.3g} nats from the "
                f"trainer's (tolerance {tol:g}{'; nearer the previous sync' if stale else ''}); the sampler would "
                "generate from stale weights. The weight push (the merged weights under LoRA) did not reach the "
                "sampler (grpo_core/trainer/weight_sync.py: push_weights)")
        self.last_probe = trainer


def verify_digests(held: dict[str, tuple[str, str]], model: torch.nn.Module, names: list[str], sync: str) -> None:
    """Fail with ``WeightSyncError`` unless the sampler's hashes ``held`` of ``names`` are the trainer's merged
    tensors' cast to the sampler's dtype."""
    merged = policy_tensors(model, names)
    for name in names:
        dtype, got = held[name]
        want = tensor_digest(merged[name].to(getattr(torch, dtype.removeprefix("torch."))))
        if got != want:
            raise WeightSyncError(
                f"weight sync {sync}: the sampler's {name} is not the trainer's merged weight (sha256 {got[:12]} != "
                f"{want[:12]}); the sampler would generate from stale weights. The weight push (the merged weights under "
                "LoRA) did not reach the sampler (grpo_core/trainer/weight_sync.py: push_weights)")
