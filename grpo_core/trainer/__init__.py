"""The trainers: GRPO (``train_grpo(config, model_path, train_rows, output_dir)``, ``loop.py``; its loss in
``loss.py``, log-probs in ``logprobs.py``, rollouts, mixtures and the update beside them), SFT (``sft.py``) and the
Bradley-Terry reward model (``reward_model.py``), all on one training skeleton (``skeleton.py``: optimiser,
checkpoints, distributed setup, FSDP, logging)."""

from grpo_core.trainer.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint
from grpo_core.trainer.loop import train_grpo

__all__ = ["CheckpointError", "list_checkpoints", "load_latest_checkpoint", "train_grpo"]
