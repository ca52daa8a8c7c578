"""The built-in rewards are registered in one table (``BUILTIN_REWARDS``), not by importing their modules."""

from __future__ import annotations

import subprocess
import sys

import pytest

from grpo_core.rewards import BUILTIN_REWARDS, REWARD_FUNCS, get_reward_funcs, register_reward, reward_names


def test_every_builtin_resolves_by_name_to_a_callable_of_that_module():
    funcs = get_reward_funcs(list(BUILTIN_REWARDS))
    for (name, target), fn in zip(BUILTIN_REWARDS.items(), funcs):
        module, attribute = target.split(":")
        assert callable(fn) and fn is getattr(sys.modules[module], attribute), name
    assert set(BUILTIN_REWARDS) <= set(reward_names())


def test_importing_the_rewards_package_loads_no_data_module():
    """The chain task's rewards live with the task (grpo_core.data.synthetic); the rewards package does not import
    the data package to register them."""
    code = ("import sys, grpo_core.rewards; print(sorted(m for m in sys.modules if m.startswith('grpo_core.data')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_user_reward_registers_and_a_builtin_name_is_refused():
    def mine(completions, **kwargs):
        return [1.0] * len(completions)

    try:
        register_reward("test_registry_mine")(mine)
        assert get_reward_funcs(["test_registry_mine"]) == [mine] and "test_registry_mine" in reward_names()
    finally:
        REWARD_FUNCS.pop("test_registry_mine", None)
    with pytest.raises(ValueError, match="built in"):
        register_reward("chain_accuracy")(mine)
    with pytest.raises(KeyError, match="unknown reward function.*'nope'.*chain_accuracy"):
        get_reward_funcs(["nope"])
