"""The NCCL weight-sync seam (engines/vllm/native_sync.py) on CPU, against the fake vLLM's weight-transfer routes.

Only the transport is swapped: :class:`InboxSender` is the real ``TorchNcclSender`` (specs, casting, checks,
packing) whose broadcast writes each buffer where the fake's ``/update_weights`` reads it; the fake unpacks by vLLM's
rule from the announced metadata. The NCCL transport itself needs a GPU (``pytest -m cuda``; not written yet)."""

from __future__ import annotations

import asyncio
import base64
import time
from pathlib import Path

import pytest
import torch

from agentjet.generators.vllm.client import VLLMClient, VLLMServerError
from agentjet.generators.vllm.native_sync import (
    ModuleTensors,
    TensorSpec,
    TorchNcclSender,
    VLLMNativeSync,
    checked_tensors,
    pack,
    pack_plan,
    tensor_specs,
)
from agentjet.weights.sync import WeightSyncTimeout

from .fake_vllm import FakeVLLM, ServedInThread

SERVED = "policy"
PROMPT = [1, 17, 33, 250, 4, 99, 512, 7, 64, 3, 880, 21]
BUFFER = 64 * 1024  # small, so the tiny model goes in several packed buffers


class InboxSender(TorchNcclSender):
    """TorchNcclSender with files in place of NCCL: each broadcast buffer becomes ``<inbox>/NNNNNN.bin``."""

    def __init__(self, source, inbox: Path, **kw) -> None:
        super().__init__(source, device="cpu", buffer_bytes=BUFFER, **kw)
        self.inbox = inbox
        self.sent = 0
        self.opened: list[int] = []

    def _mint_unique_id(self) -> bytes:
        return bytes(range(128))

    def _open(self, unique_id: bytes, world_size: int) -> object:
        self.opened.append(world_size)
        self.sent = 0
        return object()

    def _broadcast(self, buffer: torch.Tensor) -> None:
        tmp = self.inbox / f".{self.sent:06d}.tmp"
        tmp.write_bytes(buffer.numpy().tobytes())
        tmp.rename(self.inbox / f"{self.sent:06d}.bin")  # the fake never sees half a buffer
        self.sent += 1

    def _synchronize(self) -> None:
        pass


class Policy:
    """The learner's side the seam uses: a version, and the tensors (a tied model, like SmolLM2)."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.policy_version = 0

    def named_tensors(self):
        return ModuleTensors(self.model).named_tensors()

    def step(self, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in self.model.parameters():
                p.add_(torch.randn(p.shape, generator=g) * 0.05)
        self.policy_version += 1


class Rollouts:
    policy_version = 0


@pytest.fixture
def tiny(tiny_model_path: Path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32).eval()
    assert model.config.tie_word_embeddings
    return model


@pytest.fixture
def served(tmp_path: Path, tiny_model_path: Path):
    """A fake vLLM started with the NCCL weight-transfer config, and its inbox."""
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    fake = FakeVLLM(str(tiny_model_path), SERVED, 0, weight_transfer="nccl", weight_inbox=inbox)
    fake.transfer.receive_timeout_s = 20
    with ServedInThread(fake) as srv:
        yield fake, srv.url, inbox


def logprobs(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPT])).logits[0].float(), dim=-1)
    return lp[torch.arange(len(PROMPT) - 1), torch.tensor(PROMPT[1:])]


async def served_logprobs(client: VLLMClient) -> torch.Tensor:
    return torch.tensor(await client.prompt_logprobs(SERVED, PROMPT))


async def test_a_push_runs_vllms_order_and_vllm_then_serves_the_new_weights(served, tiny):
    fake, url, inbox = served
    client = VLLMClient(url, control_timeout_s=10)
    policy, rollouts = Policy(tiny), Rollouts()
    sender = InboxSender(policy, inbox, dtype=None)  # float32 on the wire: the served logprobs match exactly
    sync = VLLMNativeSync(client, sender, timeout_s=30, init_timeout_s=10)
    try:
        for version in (1, 2):
            policy.step(seed=version)
            before = (await served_logprobs(client) - logprobs(tiny)).abs().max()
            assert before > 0.01  # the fake serves the old weights
            metrics = await sync.push(policy, rollouts)
            assert (await served_logprobs(client) - logprobs(tiny)).abs().max() < 1e-4
            assert rollouts.policy_version == version and await client.weight_version() == f"v{version}"
            assert metrics["transfer_mb"] > 0 and metrics["sync_seconds"] > 0
    finally:
        await sync.close()
        await client.aclose()

    routes = [c["route"] for c in fake.calls]
    one_round = ["pause", "start_weight_update", "update_weights", "finish_weight_update", "reset_prefix_cache",
                 "resume"]
    assert routes == ["init_weight_transfer_engine", *one_round, *one_round, "shutdown_weight_transfer_engine"]
    assert sender.opened == [2]  # one rendezvous: the trainer and the fake's one worker

    init = fake.calls[0]["init_info"]
    assert (init["rank_offset"], init["world_size"], init["packed"]) == (1, 2, True)
    assert init["packed_buffer_size_bytes"] == BUFFER and len(base64.b64decode(init["nccl_unique_id_b64"])) == 128
    pause = next(c for c in fake.calls if c["route"] == "pause")
    reset = next(c for c in fake.calls if c["route"] == "reset_prefix_cache")
    assert pause["mode"] == "keep" and reset["reset_running_requests"] is True
    assert [c["weight_version"] for c in fake.calls if c["route"] == "finish_weight_update"] == ["v1", "v2"]

    info = next(c for c in fake.calls if c["route"] == "update_weights")["update_info"]
    state = tiny.state_dict()
    assert info["names"] == list(state) and "lm_head.weight" in info["names"]  # tied, yet the head is sent
    assert "lm_head.weight" not in dict(tiny.named_parameters())
    assert set(info["dtype_names"]) == {"float32"}
    assert info["shapes"] == [list(t.shape) for t in state.values()]
    assert len(list(inbox.glob("*.bin"))) == 2 * len(pack_plan(tensor_specs(policy), BUFFER)) > 2


async def test_bf16_on_the_wire_is_announced_and_served_within_bf16_noise(served, tiny):
    fake, url, inbox = served
    client = VLLMClient(url, control_timeout_s=10)
    policy = Policy(tiny)
    sync = VLLMNativeSync(client, InboxSender(policy, inbox, dtype=torch.bfloat16), timeout_s=30)
    try:
        policy.step(seed=7)
        await sync.push(policy, Rollouts())
        diff = (await served_logprobs(client) - logprobs(tiny)).abs()
    finally:
        await client.aclose()
    info = next(c for c in fake.calls if c["route"] == "update_weights")["update_info"]
    assert set(info["dtype_names"]) == {"bfloat16"}
    assert 0 < diff.max() < 0.05  # rounded to bf16, so not exact; stale weights are off by > 0.01 on average
    assert diff.mean() < 0.01


async def test_a_hung_transfer_times_out_and_vllm_is_resumed_on_the_old_version(served, tiny):
    fake, url, inbox = served
    fake.fault["route_delay_s"] = {"update_weights": 30}
    client = VLLMClient(url, control_timeout_s=10)
    policy, rollouts = Policy(tiny), Rollouts()
    sync = VLLMNativeSync(client, InboxSender(policy, inbox, dtype=None), timeout_s=1.5)
    policy.step(seed=1)
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncTimeout, match="nccl weight sync to policy v1"):
            await sync.push(policy, rollouts)
    finally:
        await client.aclose()
    assert time.monotonic() - t0 < 10
    routes = [c["route"] for c in fake.calls]
    assert routes == ["init_weight_transfer_engine", "pause", "start_weight_update", "update_weights", "resume"]
    assert rollouts.policy_version == 0 and not sync.connected  # the group is dropped: the next push makes one


async def test_a_hung_rendezvous_times_out_before_anything_is_paused(served, tiny):
    fake, url, inbox = served
    fake.fault["route_delay_s"] = {"init_weight_transfer_engine": 30}
    client = VLLMClient(url, control_timeout_s=10)
    sync = VLLMNativeSync(client, InboxSender(Policy(tiny), inbox), timeout_s=30, init_timeout_s=1)
    t0 = time.monotonic()
    try:
        with pytest.raises(WeightSyncTimeout) as raised:
            await sync.push(Policy(tiny), Rollouts())
    finally:
        await client.aclose()
    assert "rendezvous with vLLM (2 ranks) did not finish within 1 s" in str(raised.value.__cause__)
    assert time.monotonic() - t0 < 10
    assert [c["route"] for c in fake.calls] == ["init_weight_transfer_engine"] and not sync.connected


async def test_weights_without_the_output_head_are_refused_before_vllm_is_paused(served, tiny):
    fake, url, inbox = served

    class ParametersOnly(Policy):  # named_parameters() drops a tied head: vLLM would keep its old one
        def named_tensors(self):
            return iter(self.model.named_parameters())

    client = VLLMClient(url, control_timeout_s=10)
    policy = ParametersOnly(tiny)
    sync = VLLMNativeSync(client, InboxSender(policy, inbox), timeout_s=30)
    try:
        with pytest.raises(ValueError, match="lm_head.weight"):
            await sync.push(policy, Rollouts())
    finally:
        await client.aclose()
    assert "pause" not in [c["route"] for c in fake.calls]


async def test_the_fake_refuses_calls_out_of_vllms_order(served, tmp_path, tiny_model_path):
    """What makes the order assertions above worth something: vLLM's worker refuses these, and so does the fake."""
    fake, url, inbox = served
    client = VLLMClient(url, control_timeout_s=10)
    info = {"names": ["model.norm.weight"], "dtype_names": ["float32"], "shapes": [[192]]}
    try:
        with pytest.raises(VLLMServerError, match="start_weight_update must be called before"):
            await client.update_weights(info)
        with pytest.raises(VLLMServerError, match="without a matching start_weight_update"):
            await client.finish_weight_update("v1")
        await client.start_weight_update()
        with pytest.raises(VLLMServerError, match="already active"):
            await client.start_weight_update()
        with pytest.raises(VLLMServerError, match="not initialized"):
            await client.update_weights(info)  # no group yet; the failure also ends the round
        with pytest.raises(VLLMServerError, match="not both"):
            await client.init_weight_transfer_engine({"master_address": "127.0.0.1", "master_port": 1,
                                                      "nccl_unique_id_b64": "AA==", "rank_offset": 1,
                                                      "world_size": 2})
    finally:
        await client.aclose()

    unconfigured = FakeVLLM(str(tiny_model_path), SERVED, 0)
    with ServedInThread(unconfigured) as srv:
        client = VLLMClient(srv.url, control_timeout_s=10)
        try:
            with pytest.raises(VLLMServerError, match="Weight transfer not configured"):
                await client.start_weight_update()
        finally:
            await client.aclose()


def test_pack_plan_closes_a_buffer_once_it_is_over_the_size():
    def spec(n: int) -> TensorSpec:
        return TensorSpec(f"t{n}", torch.float32, (n,))

    specs = [spec(n) for n in (4, 4, 1, 10, 2, 2)]  # 16, 16, 4, 40, 8, 8 bytes
    assert [list(c) for c in pack_plan(specs, 32)] == [[0, 1, 2], [3], [4, 5]]
    assert [list(c) for c in pack_plan(specs, 1 << 30)] == [[0, 1, 2, 3, 4, 5]]
    assert pack_plan([], 32) == []


def test_pack_lays_bytes_out_as_the_receiver_splits_them():
    tensors = [torch.arange(6, dtype=torch.float32).view(2, 3).t(), torch.tensor([1, 2], dtype=torch.int64),
               torch.tensor([0.5], dtype=torch.bfloat16)]  # the first one is not contiguous
    specs = [TensorSpec(f"t{i}", t.dtype, tuple(t.shape)) for i, t in enumerate(tensors)]
    it = iter(tensors)
    buf = pack(it, specs[:2], torch.device("cpu"))
    assert buf.dtype == torch.uint8 and buf.numel() == 24 + 16
    assert pack(it, specs[2:], torch.device("cpu")).view(torch.bfloat16).item() == 0.5  # takes up where it was
    for t, part in zip(tensors, buf.split([24, 16]), strict=False):
        assert torch.equal(part.view(t.dtype).view(t.shape), t)


def test_pack_copies_each_tensor_before_drawing_the_next():
    """A gathered shard may be freed or overwritten once the source moves on (TRL #6765's packed-sync bug)."""
    scratch = torch.zeros(3)

    def reused():  # yields the same storage each time, overwritten on resume
        for v in (1.0, 2.0):
            scratch.fill_(v)
            yield scratch

    specs = [TensorSpec("a", torch.float32, (3,)), TensorSpec("b", torch.float32, (3,))]
    assert pack(reused(), specs, torch.device("cpu")).view(torch.float32).tolist() == [1.0] * 3 + [2.0] * 3


def test_a_source_that_differs_from_its_announcement_is_caught_naming_the_tensor(tiny):
    specs = tensor_specs(ModuleTensors(tiny), torch.bfloat16)
    assert {s.dtype for s in specs} == {torch.bfloat16} and specs[-1].name == "lm_head.weight"
    wrong = [*specs[:3], TensorSpec(specs[3].name, torch.bfloat16, (1, 2)), *specs[4:]]
    with pytest.raises(ValueError, match=f"tensor 3 differs .*{specs[3].name}"):
        list(checked_tensors(ModuleTensors(tiny), wrong, torch.bfloat16))
    with pytest.raises(ValueError, match="yielded 39 tensors, 40 were announced"):
        list(checked_tensors(ModuleTensors(tiny), [*specs, TensorSpec("extra", torch.bfloat16, (1,))],
                             torch.bfloat16))


def test_the_settings_configure_the_seam(tiny):
    from agentjet.generators.vllm.native_sync import native_sync
    from agentjet.settings import VLLMSettings

    settings = VLLMSettings(platform="gpu", weight_transfer="nccl", nccl_buffer_mib=8, dtype="float16",
                            sync_timeout_s=42, control_timeout_s=7, pause_mode="wait")
    sync = native_sync(VLLMClient("http://127.0.0.1:1"), ModuleTensors(tiny), settings)
    sender = sync.sender
    assert (sender.buffer_bytes, sender.dtype, sender.device.type) == (8 << 20, torch.float16, "cuda")
    assert (sync.timeout_s, sync.init_timeout_s, sync.pause_mode, sync.transport) == (42, 7, "wait", "nccl")
    assert native_sync(VLLMClient("http://127.0.0.1:1"), ModuleTensors(tiny),
                       settings.model_copy(update={"dtype": "auto"})).sender.dtype is None
    with pytest.raises(ValueError, match="weight_transfer nccl needs platform gpu"):
        VLLMSettings(weight_transfer="nccl")


def test_the_nccl_sender_refuses_a_group_without_a_vllm_worker(tiny):
    with pytest.raises(ValueError, match="at least one vLLM worker"):
        TorchNcclSender(ModuleTensors(tiny)).init_info(1)
    with pytest.raises(RuntimeError, match="before join"):
        asyncio.run(TorchNcclSender(ModuleTensors(tiny)).send([]))
