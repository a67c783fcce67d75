"""A --tinker-key --lora-rank N server (no --adapters) accepts Tinker clients; they never touch the swarm's policy."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")

from tests.tinker_api.conftest import KEY  # noqa: E402
from tests.tinker_api.test_training import ADAM, datum  # noqa: E402


def test_lora_rank_alone_hosts_tinker_clients_beside_an_untouched_swarm_policy(make_server, tiny_model_path: Path,
                                                                               tmp_path: Path) -> None:
    from agentjet.layouts import build_adapters
    from agentjet.settings import GeneratorSettings, LearnerSettings, ServerConfig

    learner = {"lora": {"rank": 4}}
    cfg = ServerConfig(model=str(tiny_model_path), tinker_key=KEY, learner=LearnerSettings(**learner),
                       generator=GeneratorSettings(max_batch_size=8), data_dir=tmp_path / "d")
    assert cfg.swarm_adapters() == ["policy"] and cfg.default_adapter() == "policy"  # computed (test_config.py)
    srv = make_server(build_adapters(cfg), learner=learner, tinker_key=KEY)
    adapters = srv.server.adapters
    assert adapters is not None and adapters.names() == ["policy"]
    policy = [p.detach().clone() for p in adapters.engine("policy").learner.params]

    client = tinker.ServiceClient(base_url=srv.url, api_key=KEY)
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    for _ in range(2):
        tc.forward_backward([datum([1, 2, 3, 4, 5], weights=[1.0] * 4)], "cross_entropy").result()
        tc.optim_step(ADAM).result()
    after = adapters.engine("policy").learner.params
    assert all(torch.equal(a, b) for a, b in zip(policy, after, strict=True))  # the swarm's policy is untouched
