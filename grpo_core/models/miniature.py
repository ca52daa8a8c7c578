"""A model's architecture in miniature: its own config class, tokenizer and chat template, a few narrow layers,
random weights. What ``r1 check`` trains in place of the real model.

    build_miniature("Qwen/Qwen2.5-0.5B-Instruct", "/tmp/mini")     # config.json + tokenizer; no weights read

Only ``config.json`` and the tokenizer files are read (a local folder, or the hub / its local cache through
``from_pretrained``), so a check of a 7B config needs neither the weights nor the memory. The copy keeps what
the pipeline's code paths depend on: the model type and architecture class (causal LM or sequence
classifier), the tokenizer, its special tokens and chat template, the vocabulary size (padded as the real
one is), tied or untied embeddings, grouped-query attention (the ratio of query to key/value heads), the
dtype of the saved weights; it shrinks layers, widths and head size. Its outputs mean nothing: it checks
wiring, formats and shapes, not learning.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MINI_LAYERS = 2
MINI_HEAD_DIM = 32  # the smallest head size vLLM's CPU attention takes
MINI_MAX_HEADS = 4


def is_sequence_classifier(config: Any) -> bool:
    """A reward model's config (``*ForSequenceClassification``), as opposed to a causal LM's."""
    return any(a.endswith("ForSequenceClassification") for a in (getattr(config, "architectures", None) or []))


def miniature_config(config: Any, *, layers: int = MINI_LAYERS, head_dim: int = MINI_HEAD_DIM) -> Any:
    """A copy of a transformers config with ``layers`` layers and at most ``MINI_MAX_HEADS`` query heads of
    ``head_dim``, keeping the query:key/value head ratio (grouped-query attention) and the vocabulary."""
    mini = config.__class__.from_dict(config.to_dict())
    heads = getattr(config, "num_attention_heads", None)
    if heads:
        kv = getattr(config, "num_key_value_heads", None) or heads
        group = max(1, heads // kv)
        kv_mini = max(1, MINI_MAX_HEADS // group)
        mini.num_attention_heads = kv_mini * group
        mini.num_key_value_heads = kv_mini
        mini.hidden_size = mini.num_attention_heads * head_dim
        if getattr(config, "head_dim", None):
            mini.head_dim = head_dim
    if getattr(config, "intermediate_size", None):
        mini.intermediate_size = 2 * mini.hidden_size
    if hasattr(config, "num_hidden_layers"):
        mini.num_hidden_layers = layers
    if getattr(config, "layer_types", None):  # per-layer attention kinds (Qwen3, Gemma): as many as layers
        kinds = list(config.layer_types)
        mini.layer_types = [kinds[min(i, len(kinds) - 1)] for i in range(layers)]
    if getattr(config, "max_window_layers", None) is not None:
        mini.max_window_layers = min(config.max_window_layers, layers)
    return mini


def build_miniature(name_or_path: str, output_dir: str | Path, *, seed: int = 0) -> Path:
    """Save a random-init miniature of ``name_or_path`` (see the module docstring) with its tokenizer to
    ``output_dir``; the saved weights take the real config's dtype."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    mini = miniature_config(config)
    dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
    dtype = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    auto = AutoModelForSequenceClassification if is_sequence_classifier(config) else AutoModelForCausalLM
    torch.manual_seed(seed)
    model = auto.from_config(mini, dtype=dtype)
    output_dir = Path(output_dir)
    model.save_pretrained(output_dir, safe_serialization=True)
    tokenizer.save_pretrained(output_dir)
    try:  # sampling defaults (eos ids, temperature) as the real model ships them
        from transformers import GenerationConfig

        GenerationConfig.from_pretrained(name_or_path).save_pretrained(output_dir)
    except (OSError, ValueError):
        pass
    return output_dir
