"""save_state / load_state with tinker:// paths under the data dir: the weights and optimizer state survive a restart."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.server
tinker = pytest.importorskip("tinker")

from tests.tinker_api.test_training import ADAM, datum, seq_logprob  # noqa: E402

TOKENS = [5, 10, 15, 20, 25, 30]


def step(tc) -> None:
    tc.forward_backward([datum(TOKENS, weights=[1.0] * 5)], "cross_entropy").result()
    tc.optim_step(ADAM).result()


def test_load_state_after_a_restart_gives_back_weights_and_optimizer_state(tinker_server, tmp_path) -> None:
    import tinker as t

    data_dir = tmp_path / "run"
    srv = tinker_server(data_dir=data_dir)
    client = t.ServiceClient(base_url=srv.url, api_key="tml-test-key-0123456789")
    tc = client.create_lora_training_client(base_model="tiny", rank=4).result()
    step(tc)
    path = tc.save_state("after-one").result().path
    assert path.startswith("tinker://") and path.endswith("/weights/after-one")
    saved = seq_logprob(tc, TOKENS)
    step(tc)  # the reference: a second step from the saved state, optimizer state included
    reference = seq_logprob(tc, TOKENS)
    srv.stop()

    srv2 = tinker_server(data_dir=data_dir)
    client2 = t.ServiceClient(base_url=srv2.url, api_key="tml-test-key-0123456789")
    tc2 = client2.create_lora_training_client(base_model="tiny", rank=4).result()
    fresh = seq_logprob(tc2, TOKENS)
    assert abs(fresh - saved) > 1e-3
    tc2.load_state_with_optimizer(path).result()
    assert seq_logprob(tc2, TOKENS) == pytest.approx(saved, abs=1e-4)
    step(tc2)
    assert seq_logprob(tc2, TOKENS) == pytest.approx(reference, abs=1e-4)  # Adam's moments came back too
    # weights only: the same weights, a fresh optimizer
    tc3 = client2.create_lora_training_client(base_model="tiny", rank=4).result()
    tc3.load_state(path).result()
    assert seq_logprob(tc3, TOKENS) == pytest.approx(saved, abs=1e-4)
    with pytest.raises(t.RequestFailedError, match="no checkpoint"):
        tc3.load_state(path.replace("after-one", "missing")).result()
    with pytest.raises(t.RequestFailedError, match="rank"):
        client2.create_lora_training_client(base_model="tiny", rank=8).result().load_state(path).result()
    assert np.isfinite(seq_logprob(tc3, TOKENS))


def test_create_training_client_from_state_with_and_without_the_optimizer(service_client) -> None:
    client = service_client()
    tc = client.create_lora_training_client(base_model="tiny", rank=3).result()
    step(tc)
    path = tc.save_state("s1").result().path
    saved = seq_logprob(tc, TOKENS)
    step(tc)
    reference = seq_logprob(tc, TOKENS)  # a second step from the saved state, optimizer state included

    with_opt = client.create_training_client_from_state_with_optimizer(path).result()
    assert with_opt.get_info().lora_rank == 3 and with_opt.model_id != tc.model_id
    assert seq_logprob(with_opt, TOKENS) == pytest.approx(saved, abs=1e-5)
    step(with_opt)
    assert seq_logprob(with_opt, TOKENS) == pytest.approx(reference, abs=1e-4)

    weights_only = client.create_training_client_from_state(path).result()
    assert seq_logprob(weights_only, TOKENS) == pytest.approx(saved, abs=1e-5)
    with pytest.raises(Exception, match="no checkpoint"):
        client.create_training_client_from_state(path.replace("s1", "nope")).result()
