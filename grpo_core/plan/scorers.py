"""The reward models and judges a stage loads beside its policy: their bytes, and the GPU they land on.

    scorer = Scorer("rm_helpful", "reward_model", KNOWN_SHAPES["Skywork/Skywork-Reward-V2-Qwen3-0.6B"], 16, 1024)
    place_scorers([scorer], processes=8, gpus=8, resident=True)   # {7: ScorerLoad(8 copies ...)}

What is counted follows what the reward functions do (``grpo_core.rewards.reward_model`` / ``judge``):

- weights: both load ``float32`` (``from_pretrained(path, dtype=torch.float32)``) whatever the stage's ``bf16``;
  a reward model is its backbone and a ``[1, h]`` score head (``...ForSequenceClassification``: no ``lm_head``),
  a judge the whole causal LM.
- device: the spec's ``device``; None is the last visible GPU (``resolve_device``). Every process of the stage
  builds its own reward functions (under torchrun each rank builds its ``Mixture``), so N ranks put N copies
  on that one GPU, and each rank brings a CUDA context to it.
- which are resident: a GRPO stage loads each distinct entry once (``trainer/mixture.py`` keys them by name: two
  names on one path are two copies) and keeps them all; rejection sampling and evaluation load one entry at a
  time (a source's, then the next source's), so the largest one counts.
- work: a reward model scores ``batch_size`` rows of up to ``max_length`` tokens in one no-grad forward; the
  allowance is the widest point of one decoder layer (the residual stream, its norm, the attention and MLP
  outputs, the MLP's gate, up, activation and product: ``4 h + 4 i`` elements a token, fp32), since a no-grad
  forward frees each layer's intermediates before the next. A judge adds the fp32 KV cache of its batch
  (prompt ``max_length`` + ``max_new_tokens``) and the last position's fp32 logits. The caching allocator keeps
  these blocks reserved after a scoring call, so they count in every phase of the stage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

from grpo_core.plan.shapes import ModelShape

GiB = 2**30
ScorerKind = Literal["reward_model", "judge"]


@dataclass(frozen=True)
class Scorer:
    """One reward model or judge a stage loads (one per distinct entry): its shape and its batch sizes."""

    name: str  # the entry's metric name
    kind: ScorerKind
    shape: ModelShape
    batch_size: int
    max_length: int
    max_new_tokens: int = 0  # a judge's verdict length
    device: str | None = None  # the spec's device: None = the last visible GPU

    @property
    def num_params(self) -> int:
        if self.kind == "judge":
            return self.shape.num_params
        s = self.shape  # ...ForSequenceClassification: the lm_head (when not tied) gives way to a [1, h] score head
        return s.num_params - (0 if s.tie_word_embeddings else s.vocab_size * s.hidden_size) + s.hidden_size

    @property
    def weight_bytes(self) -> int:
        return 4 * self.num_params  # float32

    @property
    def work_bytes(self) -> int:
        """Scoring's transient bytes: one layer's widest point over the batch, plus a judge's cache and logits."""
        s, rows = self.shape, self.batch_size
        work = rows * self.max_length * (4 * s.hidden_size + 4 * s.intermediate_size) * 4
        if self.kind == "judge":
            work += rows * (self.max_length + self.max_new_tokens) * s.kv_bytes_per_token * 2  # fp32 K and V
            work += 2 * rows * s.vocab_size * 4  # the last position's logits and their softmax
        return work


@dataclass
class ScorerLoad:
    """What one GPU holds of the stage's scorers."""

    weights: int = 0
    work: int = 0
    contexts: int = 0  # processes with no other business on this GPU: a CUDA context each
    copies: int = 0
    processes: int = 0  # how many processes put copies here
    names: list[str] | None = None  # the entries whose copies are here
    weight_each: list[int] | None = None

    @property
    def total(self) -> int:
        return self.weights + self.work

    def label(self, resident: bool) -> str:
        """``rm_helpful+rm_harmless 2 x 2.22 GiB`` (``|`` when they are loaded one at a time)."""
        names = list(dict.fromkeys(self.names or []))
        sizes = sorted(set(self.weight_each or []))
        each = f"{sizes[0] / GiB:.2f} GiB" if len(sizes) == 1 else "/".join(f"{b / GiB:.2f}" for b in sizes) + " GiB"
        text = f"{('+' if resident else '|').join(names)} {self.copies} x {each}"
        if self.processes > 1:
            text += f" ({self.copies // self.processes} from each of {self.processes} processes)"
        return text + ("" if resident or len(names) < 2 else " (one at a time)")


def gpu_index(device: str | None, gpus: int, own: int) -> int | None:
    """The GPU ``device`` resolves to in a process on GPU ``own`` that sees ``gpus`` GPUs (``resolve_device``):
    None = the last; ``cuda`` = the process's current device (its own); ``cuda:k`` = k; else not a GPU."""
    if device is None:
        return gpus - 1
    if device == "cuda":
        return own
    if device.startswith("cuda:"):
        return int(device.split(":", 1)[1])
    return None


def place_scorers(scorers: Sequence[Scorer], processes: int, gpus: int, *, resident: bool,
                  on_cpu: bool = False) -> dict[int, ScorerLoad]:
    """Per GPU index, what the stage's ``processes`` (on GPUs ``0 .. processes-1``, each seeing ``gpus`` GPUs)
    put there of ``scorers``. ``resident``: every scorer is held at once (GRPO); else one at a time, the largest.
    Processes score at the same time, so their work adds up; within one process it is one call at a time.
    ``on_cpu``: no GPU (``resolve_device`` falls back to the CPU), so each process holds its own in its memory."""
    loads: dict[int, ScorerLoad] = {}
    for rank in range(processes):
        here: dict[int, list[Scorer]] = {}
        for s in scorers:
            index = rank if on_cpu else gpu_index(s.device, gpus, rank)
            if index is not None:
                here.setdefault(index, []).append(s)
        for index, group in here.items():
            held = group if resident else [max(group, key=lambda s: s.weight_bytes + s.work_bytes)]
            load = loads.setdefault(index, ScorerLoad(names=[], weight_each=[]))
            load.weights += sum(s.weight_bytes for s in held)
            load.work += max(s.work_bytes for s in held)
            load.copies += len(held)
            load.names += [s.name for s in group]
            load.weight_each += [s.weight_bytes for s in held]
            load.contexts += index != rank
            load.processes += 1
    return loads
