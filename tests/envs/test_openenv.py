"""OpenEnv over HTTP: a real openenv-core server on 127.0.0.1 (uvicorn in a thread), grouprl's client adapter.

openenv-core is in the ``test`` extra (its gradio needs pillow < 13: constraints.txt pins pillow 12.3.0), so
``make test`` runs these; they skip, saying so, only where it is not installed.
The server admits exactly B x G = 4 sessions, so a run whose rollouts did not close their sessions would
fail at the second step with "Server at capacity".
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

pytest.importorskip("openenv.core.env_server.http_server")
uvicorn = pytest.importorskip("uvicorn")

from fn_engine import FN, FnEngine  # noqa: E402

from grouprl import GRPOConfig, GRPOTrainer  # noqa: E402
from grouprl.envs import make_env_factory  # noqa: E402
from grouprl.envs.resolve import resolve_environment  # noqa: E402

E = "<|im_end|>"


def _server_classes():
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State

    class Say(Action):
        message: str

    class Heard(Observation):
        prompt: str = ""

    class CountDown(Environment):
        """Say the numbers from 3 down to 1; each right one is worth 1, the episode ends after 3 turns."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def reset(self, seed=None, episode_id=None, **kwargs):
            self.expect, self.turns = 3, 0
            return Heard(prompt="Count down from 3.", done=False, reward=None)

        def step(self, action, timeout_s=None, **kwargs):
            self.turns += 1
            reward = 1.0 if action.message.strip() == str(self.expect) else 0.0
            self.expect -= 1
            return Heard(prompt=f"now {self.expect}", done=self.turns >= 3, reward=reward)

        @property
        def state(self):
            return State(step_count=getattr(self, "turns", 0))

    return CountDown, Say, Heard


@pytest.fixture(scope="module")
def server_url():
    from openenv.core.env_server.http_server import create_fastapi_app

    env, action, observation = _server_classes()
    app = create_fastapi_app(env, action, observation, max_concurrent_envs=4)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline:
            raise RuntimeError("the OpenEnv test server did not start within 30 s")
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def test_one_session_per_rollout_closed_after(server_url):
    cls = resolve_environment(f"openenv:{server_url}?observation=prompt")
    env = make_env_factory(environment_factory=cls)()
    assert env.conversational and env.tools == []
    assert env.reset({}) == "Count down from 3."
    assert env.respond("3") == ("now 2", 1.0, False)
    assert env.respond("7") == ("now 1", 0.0, False)
    assert env.respond("1") == (None, 1.0, True)
    assert env.reward() == 2.0  # the step rewards, summed
    env.close()
    # five sessions one after the other on a 4-session server: each close freed its slot
    for _ in range(5):
        other = make_env_factory(environment_factory=cls)()
        other.reset({})
        other.close()


def test_openenv_environment_trains_for_20_steps(tmp_path, tiny_model_dir, monkeypatch, server_url):
    def policy(model, tokenizer, stop_ids=None, **kw):
        def generate(prompts, budgets, params):
            return [tokenizer.encode(str(3 - tokenizer.decode(p).count("now ")) + E, add_special_tokens=False)
                    for p in prompts]

        return generate

    monkeypatch.setattr(FnEngine, "policy", staticmethod(policy))
    cfg = GRPOConfig(output_dir=str(tmp_path / "out"), rollout_backend=FN, num_generations=2, per_device_train_batch_size=4,
                     max_new_tokens=128, max_prompt_length=128, max_steps=20, max_turns=4, learning_rate=1e-3,
                     progress_bar=False, save_strategy="no", seed=0, eval_split=None, logging_steps=1,
                     environment=f"openenv:{server_url}?observation=prompt")
    trainer = GRPOTrainer(model=str(tiny_model_dir), config=cfg)  # no dataset: reset() writes the prompt
    trainer.train()
    records = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 20  # 80 sessions on a 4-session server: every rollout closed its own
    assert all(r["rewards/OpenEnvEnv/mean"] == 3.0 and r["end_reason/env_done"] == 1.0 for r in records)
