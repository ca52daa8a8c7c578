"""What the memory benchmarks share: the model they measure and how a child process reads its own peak.

Imported by ``logprob_memory.py`` and ``sft_memory.py`` (run as scripts, so this folder is on sys.path).
"""

from __future__ import annotations

from typing import Any


def read_status_kib(field: str) -> int:
    """A ``/proc/self/status`` field (``VmRSS``, ``VmHWM``) in KiB."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def reset_peak_rss() -> int:
    """Reset the kernel's RSS high-water mark to the current RSS (Linux >= 4.0); returns that RSS in KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return read_status_kib("VmRSS")


def qwen_one_layer(vocab: int, hidden: int) -> Any:
    """A 1-layer Qwen2 with Qwen2.5-0.5B's widths (tied embeddings), random init with seed 0, fp32."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(
        vocab_size=vocab, hidden_size=hidden, intermediate_size=4864, num_hidden_layers=1,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=4096, tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.float32)
