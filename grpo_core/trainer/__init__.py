"""The GRPO trainer: ``train_grpo(config, model_path, train_rows, output_dir)`` (see ``loop.py``), and the
training skeleton it shares with the SFT trainer (``skeleton.py``; ``grpo_core.sft.train_sft``)."""

from grpo_core.trainer.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint
from grpo_core.trainer.loop import train_grpo

__all__ = ["CheckpointError", "list_checkpoints", "load_latest_checkpoint", "train_grpo"]
