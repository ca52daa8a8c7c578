"""The dtype a model folder's weights are saved in, read from its config.json: the final model's ``save_dtype:
auto`` and a LoRA run's frozen base use it (a module of its own so both ``skeleton`` and ``lora`` import it)."""

from __future__ import annotations

from pathlib import Path

import torch

SAVE_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_save_dtype(save_dtype: str, base_model: Path | str) -> torch.dtype:
    """The dtype the final model is written in: ``save_dtype``, or (``auto``) the base model's, read from its
    config.json (``dtype``, or ``torch_dtype`` in older files; fp32 when it names none). The trainer always runs on
    fp32 weights (``load_model``), so without this a bf16 base would be committed at twice its size."""
    if save_dtype != "auto":
        return SAVE_DTYPES[save_dtype]
    from transformers import AutoConfig

    dtype = AutoConfig.from_pretrained(base_model).dtype
    if isinstance(dtype, str):
        dtype = SAVE_DTYPES.get(dtype)
    return dtype if dtype in SAVE_DTYPES.values() else torch.float32
