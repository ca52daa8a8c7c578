"""The sizes of a Qwen2/Qwen3/Llama-style decoder from its ``config.json``, and the shapes of known hub models.

    resolve_model_shape("Qwen/Qwen2.5-7B-Instruct").num_params      # 7,615,616,512 (model card: 7.61B)

A local folder is read with AutoConfig (no weights are loaded); a hub name without a local folder is looked
up in ``KNOWN_SHAPES`` (copied from the models' config.json files), since the planner must work offline.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a Qwen2/Llama-style decoder, named as in ``config.json``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool
    attention_bias: bool = True  # Qwen2: q/k/v projections carry biases (Llama: config.attention_bias)
    head_dim: int = 0  # 0: hidden_size // num_attention_heads
    max_position_embeddings: int = 32768
    qk_norm: bool = False  # Qwen3: an RMSNorm over each head's q and k (head_dim weights each)
    dtype_bytes: int = 4  # bytes per weight as saved (config.json dtype; fp32 when it names none): a LoRA base's

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)

    @classmethod
    def from_config(cls, config: Any) -> "ModelShape":
        """From a transformers config object or a ``config.json`` mapping."""
        get = config.get if isinstance(config, dict) else lambda k, d=None: getattr(config, k, d)
        model_type = get("model_type", "")
        heads = get("num_attention_heads")
        return cls(
            hidden_size=get("hidden_size"), intermediate_size=get("intermediate_size"),
            num_hidden_layers=get("num_hidden_layers"), num_attention_heads=heads,
            num_key_value_heads=get("num_key_value_heads") or heads, vocab_size=get("vocab_size"),
            tie_word_embeddings=bool(get("tie_word_embeddings", False)),
            attention_bias=bool(get("attention_bias", model_type == "qwen2")),
            head_dim=get("head_dim") or 0, max_position_embeddings=get("max_position_embeddings") or 32768,
            qk_norm=model_type.startswith("qwen3"), dtype_bytes=_dtype_bytes(get("dtype") or get("torch_dtype")),
        )

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """``(in, out)`` features of each decoder layer's linear module, by name (what LoRA can target)."""
        h, q, kv, i = self.hidden_size, self.num_attention_heads * self.head_dim, self.kv_dim, self.intermediate_size
        return {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, i), "up_proj": (h, i), "down_proj": (i, h)}

    def lora_params(self, r: int, target_modules: list[str] | str) -> int:
        """Trainable parameters of rank-``r`` adapters on ``target_modules`` (all-linear: every decoder linear;
        PEFT leaves lm_head out): ``r x (in + out)`` per adapted module."""
        shapes = self.linear_shapes()
        names = shapes if target_modules == "all-linear" else [n for n in target_modules if n in shapes]
        return self.num_hidden_layers * sum(r * sum(shapes[n]) for n in names)

    @property
    def linear_params(self) -> int:
        """Weights of every decoder layer's linear modules (what QLoRA quantises to 4 bits)."""
        return self.num_hidden_layers * sum(a * b for a, b in self.linear_shapes().values())

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden_size, self.num_attention_heads * self.head_dim, self.kv_dim
        attn = h * q + 2 * h * kv + q * h + ((q + 2 * kv) if self.attention_bias else 0)
        attn += 2 * self.head_dim if self.qk_norm else 0
        return attn + 3 * h * self.intermediate_size + 2 * h  # + SwiGLU gate/up/down + two RMSNorms

    @property
    def root_params(self) -> int:
        """What is not in a decoder layer: embeddings, ``lm_head`` (unless tied), the final norm."""
        return self.vocab_size * self.hidden_size * (1 if self.tie_word_embeddings else 2) + self.hidden_size

    @property
    def num_params(self) -> int:
        return self.root_params + self.num_hidden_layers * self.layer_params

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token, at 2 bytes (bf16; x2 for fp32)."""
        return 2 * self.num_hidden_layers * self.kv_dim * 2


def _dtype_bytes(dtype: Any) -> int:
    name = str(dtype or "float32").removeprefix("torch.")
    return 2 if name in ("bfloat16", "float16") else 4


# config.json of the Qwen2.5 family, copied from https://huggingface.co/Qwen/<name>/blob/main/config.json
# (the Instruct and Math variants share their base model's shapes; Math-7B's context is 4096). Used when the
# model is not a local folder; a local folder is read with AutoConfig instead.
_QWEN_SMALL = dict(num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, max_position_embeddings=32768,
                   dtype_bytes=2)  # the Qwen2.5 and Qwen3 checkpoints are bfloat16
_QWEN_LARGE = dict(vocab_size=152064, tie_word_embeddings=False, max_position_embeddings=131072, dtype_bytes=2)
_KNOWN = {
    "Qwen2.5-0.5B": ModelShape(896, 4864, 24, 14, **_QWEN_SMALL),
    "Qwen2.5-1.5B": ModelShape(1536, 8960, 28, 12, **_QWEN_SMALL),
    "Qwen2.5-3B": ModelShape(2048, 11008, 36, 16, **_QWEN_SMALL),
    "Qwen2.5-7B": ModelShape(3584, 18944, 28, 28, num_key_value_heads=4, **_QWEN_LARGE),
    "Qwen2.5-14B": ModelShape(5120, 13824, 48, 40, num_key_value_heads=8, **_QWEN_LARGE),
    "Qwen2.5-32B": ModelShape(5120, 27648, 64, 40, num_key_value_heads=8, **_QWEN_LARGE),
}
# Qwen3-0.6B (huggingface.co/Qwen/Qwen3-0.6B config.json): no q/k/v biases, q/k norms, head_dim 128 (q is 2048
# wide on a 1024 residual). Skywork-Reward-V2-Qwen3-0.6B is it as a Qwen3ForSequenceClassification (the same
# backbone, a score head instead of the tied lm_head): the reward model the shipped configs name.
_QWEN3_0_6B = ModelShape(1024, 3072, 28, 16, num_key_value_heads=8, vocab_size=151936, tie_word_embeddings=True,
                         attention_bias=False, head_dim=128, max_position_embeddings=40960, qk_norm=True,
                         dtype_bytes=2)
KNOWN_SHAPES: dict[str, ModelShape] = {
    **{f"Qwen/{k}": v for k, v in _KNOWN.items()},
    **{f"Qwen/{k}-Instruct": v for k, v in _KNOWN.items()},
    "Qwen/Qwen2.5-Math-1.5B": _KNOWN["Qwen2.5-1.5B"],
    "Qwen/Qwen2.5-Math-7B": dataclasses.replace(_KNOWN["Qwen2.5-7B"], max_position_embeddings=4096),
    "Qwen/Qwen3-0.6B": _QWEN3_0_6B,
    "Skywork/Skywork-Reward-V2-Qwen3-0.6B": _QWEN3_0_6B,
}


def resolve_model_shape(name_or_path: str) -> ModelShape:
    """A local folder's ``config.json`` (through AutoConfig), else the known-architectures table."""
    path = Path(name_or_path)
    if (path / "config.json").is_file():
        from transformers import AutoConfig

        return ModelShape.from_config(AutoConfig.from_pretrained(path))
    if name_or_path in KNOWN_SHAPES:
        return KNOWN_SHAPES[name_or_path]
    raise ValueError(
        f"model {name_or_path!r}: not a local folder with a config.json and not in the planner's table of known "
        f"architectures ({', '.join(sorted(KNOWN_SHAPES))}); download its config.json into a folder and name that "
        "folder in model.name_or_path"
    )
