"""derive_seed keeps the values the trainer's completion seeds and prompt shuffles had before it existed."""

from __future__ import annotations

from grpo_core.generation.prompts import PromptStream
from grpo_core.seeds import derive_seed, seeded_rng


def test_derive_seed_reproduces_the_recorded_completion_seeds():
    # recorded from generation/prompts.py's completion_seed(0, 1, 2, 3) before derive_seed replaced it
    assert derive_seed(0, 1, 2, 3) == 6463705122041852897
    assert 0 <= derive_seed(7, 0, 0, 0) < 2**63  # fits a signed 64-bit seed (vLLM, torch)
    assert derive_seed(0, 1, 2, 3) != derive_seed(0, 1, 2, 4) != derive_seed(1, 1, 2, 4)
    assert derive_seed(0, 12) != derive_seed(0, 1, 2)  # keys are hashed as a tuple, not concatenated


def test_prompt_stream_shuffles_as_recorded():
    # recorded from PromptStream(5, seed=3) (np.random.default_rng([3, epoch])) before seeded_rng
    assert PromptStream(5, seed=3).rows_at(0, 5) == [4, 2, 1, 3, 0]
    assert seeded_rng(3, 0).permutation(5).tolist() == [4, 2, 1, 3, 0]
