"""The NCCL weight-sync seam: new weights go from the learner's GPU to vLLM's workers through vLLM's native
weight-transfer API (vLLM >= 0.16; written against vLLM 0.32), with no disk in between.

**Unverified on a GPU.** The control plane is tested on CPU against the fake vLLM (tests/generators/vllm/fake_vllm.py)
with the transport swapped for files; the NCCL transport itself (:class:`TorchNcclSender`) has not run yet.
vLLM's CPU build has no weight-transfer backend that runs on CPU (docs/vllm.md, "NCCL weight transfer").

Two planes:

- the **control plane**, HTTP to vLLM's dev-mode routes (:class:`VLLMClient`): once,
  ``POST /init_weight_transfer_engine`` (vLLM's workers join the trainer's NCCL group); then per sync
  ``POST /start_weight_update`` -> ``POST /update_weights`` (announces names, dtypes and shapes, and returns once
  the workers have received them) -> ``POST /finish_weight_update``;
- the **data plane**, a :class:`TensorSender` on the trainer's side: rank 0 of that group, it broadcasts the
  tensors, packed into buffers, while ``/update_weights`` is in flight.

A push (:meth:`VLLMNativeSync._push`): rendezvous if there is no group yet -> ``/pause`` -> start -> update and
send, concurrently -> finish (with ``weight_version = "v{N}"``) -> ``/reset_prefix_cache`` -> ``/resume`` (always)
-> the generator serves version N. The probe, as on the reload path, is the layout's business.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

import torch

from agentjet.engines.base import Generator, Learner
from agentjet.generators.vllm.client import VLLMClient, VLLMError
from agentjet.weights.io import DTYPES, untied_named_tensors
from agentjet.weights.sync import WeightSync, WeightSyncTimeout

if TYPE_CHECKING:
    from agentjet.settings import VLLMSettings

T = TypeVar("T")

HEAD = "lm_head.weight"
DEFAULT_BUFFER_BYTES = 1 << 30  # vLLM's default packed buffer (1 GiB); both sides hold num_buffers of them
DEFAULT_NUM_BUFFERS = 2
NCCL_UNIQUE_ID_BYTES = 128


# ---------------------------------------------------------------------------------------------- what is sent
@dataclass(frozen=True)
class TensorSpec:
    """One tensor as vLLM's workers expect it: checkpoint name, wire dtype, full shape."""

    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")  # what vLLM reads back with getattr(torch, name)


@runtime_checkable
class NamedTensorSource(Protocol):
    """What a learner implements to be sent over NCCL."""

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """Every tensor vLLM's model loads, by Hugging Face checkpoint name, untied (an explicit
        ``lm_head.weight``; the rule is ``weights.io.untied_named_tensors``). Each call is a fresh pass
        with the same names, order, dtypes and shapes. A tensor may be a shard (``DTensor``): its ``shape`` is the
        full one, and it is gathered (``full_tensor()``) only when sent."""
        ...


class ModuleTensors:
    """:class:`NamedTensorSource` over a module, by the tied-head rule."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.module = module

    def named_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        return untied_named_tensors(self.module)


def wire_dtype(dtype: torch.dtype, cast: torch.dtype | None) -> torch.dtype:
    return cast if cast is not None and dtype.is_floating_point else dtype


def tensor_specs(source: NamedTensorSource, cast: torch.dtype | None = None) -> list[TensorSpec]:
    """The specs of one pass, read from shapes and dtypes only (nothing is gathered or copied)."""
    return [TensorSpec(name, wire_dtype(t.dtype, cast), tuple(t.shape)) for name, t in source.named_tensors()]


def update_info(specs: Sequence[TensorSpec]) -> dict[str, list[Any]]:
    """The body of ``/update_weights`` for vLLM's NCCL backend (``NCCLWeightTransferUpdateInfo``)."""
    return {"names": [s.name for s in specs], "dtype_names": [s.dtype_name for s in specs],
            "shapes": [list(s.shape) for s in specs]}


def require_head(specs: Sequence[TensorSpec]) -> None:
    """vLLM serves an untied model (it starts from an untied export), so a transfer without ``lm_head.weight``
    would leave it serving the new body with the old head."""
    if not any(s.name == HEAD for s in specs):
        raise ValueError(f"the weights to send have no {HEAD!r}: a tied model must send its output head "
                         "explicitly (engines.vllm.weights.untied_named_tensors)")


def materialize(tensor: torch.Tensor) -> torch.Tensor:
    """A full local tensor: a shard (``DTensor``) is gathered, which is a collective on its ranks."""
    full = getattr(tensor, "full_tensor", None)
    return full() if callable(full) else tensor


def checked_tensors(source: NamedTensorSource, specs: Sequence[TensorSpec],
                    cast: torch.dtype | None) -> Iterator[torch.Tensor]:
    """One pass of ``source``, gathered and cast, each checked against the spec vLLM was told: the workers cut
    their receive buffers from the specs, so a mismatch would hang the transfer or load garbage."""
    i = 0
    for name, tensor in source.named_tensors():
        if i >= len(specs):
            raise ValueError(f"the source yields more tensors than the {len(specs)} announced; first extra: {name!r}")
        full = materialize(tensor.detach())
        full = full.to(wire_dtype(full.dtype, cast))
        got = TensorSpec(name, full.dtype, tuple(full.shape))
        if got != specs[i]:
            raise ValueError(f"tensor {i} differs from what vLLM was told: announced {specs[i]}, got {got}")
        i += 1
        yield full
    if i != len(specs):
        raise ValueError(f"the source yielded {i} tensors, {len(specs)} were announced")


def pack_plan(specs: Sequence[TensorSpec], buffer_bytes: int) -> list[range]:
    """Which tensors go in each packed broadcast, by vLLM's rule (both sides derive it from the specs): a chunk
    takes tensors in order and closes once its bytes exceed ``buffer_bytes``, the crossing tensor included."""
    chunks: list[range] = []
    start, size = 0, 0
    for i, spec in enumerate(specs):
        size += spec.nbytes
        if size > buffer_bytes:
            chunks.append(range(start, i + 1))
            start, size = i + 1, 0
    if start < len(specs):
        chunks.append(range(start, len(specs)))
    return chunks


def pack(tensors: Iterator[torch.Tensor], specs: Sequence[TensorSpec], device: torch.device) -> torch.Tensor:
    """The next ``len(specs)`` tensors' raw bytes back to back in one uint8 buffer on ``device`` (the receiver
    splits it by the specs' sizes). Each tensor is copied in before the next is drawn: a source may free or
    re-shard a tensor once it moves on (a gathered shard), so no view of it is kept."""
    buffer = torch.empty(sum(s.nbytes for s in specs), dtype=torch.uint8, device=device)
    offset = 0
    for _ in specs:
        flat = next(tensors).contiguous().view(-1).view(torch.uint8)
        buffer[offset:offset + flat.numel()].copy_(flat)
        offset += flat.numel()
    return buffer


# ---------------------------------------------------------------------------------------------- the data plane
class TensorSender(Protocol):
    """The trainer's end of the transfer: rank 0 of the group vLLM's workers join at ``rank_offset`` 1. Blocking
    work runs off the event loop."""

    def init_info(self, world_size: int) -> dict[str, Any]:
        """A fresh rendezvous for a group of ``world_size`` ranks (1 + vLLM's workers): the body's ``init_info``
        of ``/init_weight_transfer_engine``, carrying the wire parameters (packing) both sides use."""
        ...

    async def join(self, init_info: dict[str, Any]) -> None:
        """Open rank 0 of that group; runs while vLLM's workers join (``/init_weight_transfer_engine``)."""
        ...

    async def specs(self) -> list[TensorSpec]:
        """What :meth:`send` will send, in order, without sending it."""
        ...

    async def send(self, specs: list[TensorSpec]) -> None:
        """Broadcast one pass of the weights; runs while ``/update_weights`` is in flight."""
        ...

    async def close(self) -> None:
        """Drop the group."""
        ...


async def in_daemon_thread(fn: Callable[..., T], *args: Any, name: str = "agentjet-nccl") -> T:
    """Run a blocking call on a daemon thread. A collective can block forever when a peer is gone; on a timeout
    the caller gives up on it, and a daemon thread does not then keep the process from exiting."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def run() -> None:
        try:
            result: Any = (True, fn(*args))
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting task
            result = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
            loop.call_soon_threadsafe(settle, *result)

    threading.Thread(target=run, name=name, daemon=True).start()
    return await future


class TorchNcclSender:
    """Rank 0 over torch's own NCCL bindings (``torch.cuda.nccl``), so the trainer's process needs no vLLM. It
    joins by vLLM's unique-id rendezvous (``nccl_unique_id_b64``; vLLM's ``NCCLWeightTransferInitInfo``): it mints
    the id, every rank calls ``ncclCommInitRank`` at once, then each issues the one-element float32 ``all_reduce``
    that vLLM's communicator runs as its warm-up. It sends packed: tensors are cast to the wire dtype, checked
    against the specs, packed by :func:`pack_plan` and broadcast from rank 0, one chunk at a time.

    Unverified on a GPU. The transport is isolated in :meth:`_mint_unique_id`, :meth:`_open`,
    :meth:`_broadcast` and :meth:`_synchronize`; everything else runs in the CPU tests."""

    def __init__(self, source: NamedTensorSource, *, device: torch.device | str = "cuda",
                 dtype: torch.dtype | None = torch.bfloat16, buffer_bytes: int = DEFAULT_BUFFER_BYTES,
                 num_buffers: int = DEFAULT_NUM_BUFFERS) -> None:
        if buffer_bytes < 1 or num_buffers < 1:
            raise ValueError("buffer_bytes and num_buffers must be >= 1")
        self.source = source
        self.device = torch.device(device)
        self.dtype = dtype
        self.buffer_bytes = buffer_bytes
        self.num_buffers = num_buffers
        self.comm: Any = None
        self._pending: tuple[bytes, int] | None = None

    def init_info(self, world_size: int) -> dict[str, Any]:
        if world_size < 2:
            raise ValueError(f"an NCCL group needs the trainer and at least one vLLM worker (world size {world_size})")
        unique_id = self._mint_unique_id()
        if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"an NCCL unique id has {NCCL_UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
        self._pending = (unique_id, world_size)
        return {"nccl_unique_id_b64": base64.b64encode(unique_id).decode("ascii"), "rank_offset": 1,
                "world_size": world_size, "packed": True, "packed_buffer_size_bytes": self.buffer_bytes,
                "packed_num_buffers": self.num_buffers}

    async def join(self, init_info: dict[str, Any]) -> None:
        if self._pending is None or base64.b64decode(init_info["nccl_unique_id_b64"]) != self._pending[0]:
            raise ValueError("join() takes the init_info this sender minted last")
        unique_id, world_size = self._pending
        self.comm = await in_daemon_thread(self._open, unique_id, world_size, name="agentjet-nccl-join")

    async def specs(self) -> list[TensorSpec]:
        return tensor_specs(self.source, self.dtype)

    async def send(self, specs: list[TensorSpec]) -> None:
        if self.comm is None:
            raise RuntimeError("send() before join(): there is no NCCL group")
        await in_daemon_thread(self._send, specs, name="agentjet-nccl-send")

    async def close(self) -> None:
        self.comm = None  # torch destroys the communicator with its handle
        self._pending = None

    def _send(self, specs: list[TensorSpec]) -> None:
        tensors = checked_tensors(self.source, specs, self.dtype)
        for chunk in pack_plan(specs, self.buffer_bytes):
            self._broadcast(pack(tensors, specs[chunk.start:chunk.stop], self.device))
        for _ in tensors:  # runs the source's end-of-pass check (nothing is left to send)
            pass
        self._synchronize()

    # ------------------------------------------------------------------ the transport (CUDA only)
    def _mint_unique_id(self) -> bytes:
        import torch.cuda.nccl as nccl

        return bytes(nccl.unique_id())

    def _open(self, unique_id: bytes, world_size: int) -> Any:
        import torch.cuda.nccl as nccl

        with torch.cuda.device(self.device):
            comm = nccl.init_rank(world_size, unique_id, 0)
            warmup = torch.zeros(1, device=self.device)  # vLLM's PyNcclCommunicator warm-up: float32, sum
            nccl.all_reduce([warmup], comms=[comm])
            torch.cuda.synchronize(self.device)
        return comm

    def _broadcast(self, buffer: torch.Tensor) -> None:
        import torch.cuda.nccl as nccl

        with torch.cuda.device(self.device):
            nccl.broadcast([buffer], root=0, comms=[self.comm])

    def _synchronize(self) -> None:
        torch.cuda.synchronize(self.device)


# ---------------------------------------------------------------------------------------------- the seam
class VLLMNativeSync(WeightSync[Learner, Generator]):
    """The weight-sync seam over vLLM's native weight transfer (NCCL). Unverified on a GPU.

    vLLM must run with ``--weight-transfer-config '{"backend": "nccl"}'`` and ``VLLM_SERVER_DEV_MODE=1``
    (:func:`vllm_args`). The group is made on the first push (or :meth:`connect`) and kept; a failed or timed-out
    transfer leaves it unusable (a peer may be stuck inside a collective), so the seam drops it and the next push
    makes a new one. After a vLLM restart, call :meth:`invalidate`.

    Generation is paused with the client's ``/pause`` and ``/resume`` directly for now; the vLLM generator's own
    ``pause()`` / ``resume()`` (which also hold new requests at its gate) take their place once it has them."""

    transport = "nccl"

    def __init__(self, client: VLLMClient, sender: TensorSender, *, timeout_s: float = 300.0,
                 init_timeout_s: float = 120.0, pause_mode: str = "keep") -> None:
        super().__init__(timeout_s)
        if not init_timeout_s > 0:
            raise ValueError("the NCCL rendezvous needs a timeout > 0")
        self.client = client
        self.sender = sender
        self.init_timeout_s = init_timeout_s
        self.pause_mode = pause_mode
        self.connected = False

    async def connect(self) -> None:
        """Rendezvous: vLLM's workers (``/init_weight_transfer_engine``) and the sender join one group."""
        world_size = 1 + await self.client.world_size()
        info = self.sender.init_info(world_size)
        try:
            async with asyncio.timeout(self.init_timeout_s):
                await _together(self.client.init_weight_transfer_engine(info, timeout=self.init_timeout_s),
                                self.sender.join(info))
        except TimeoutError as exc:
            await self.sender.close()
            raise WeightSyncTimeout(f"the NCCL rendezvous with vLLM ({world_size} ranks) did not finish within "
                                    f"{self.init_timeout_s:.0f} s") from exc
        except BaseException:
            await self.sender.close()
            raise
        self.connected = True

    def invalidate(self) -> None:
        """The group is gone (vLLM restarted): the next push makes a new one."""
        self.connected = False

    async def _push(self, learner: Learner, generator: Generator) -> dict[str, float]:
        version = learner.policy_version
        if not self.connected:
            await self.connect()
        specs = await self.sender.specs()
        require_head(specs)
        t0 = time.perf_counter()
        await self.client.pause(self.pause_mode)
        try:
            await self._transfer(specs, version)
            if not await self.client.reset_prefix_cache(reset_running_requests=True):
                raise VLLMError("vLLM did not reset its prefix cache after the weight update")
        finally:
            await self.client.resume()
        generator.policy_version = version
        return {"transfer_seconds": time.perf_counter() - t0,
                "transfer_mb": sum(s.nbytes for s in specs) / 2**20}

    async def _transfer(self, specs: list[TensorSpec], version: int) -> None:
        try:
            await self.client.start_weight_update()
            await _together(self.client.update_weights(update_info(specs), timeout=self.timeout_s),
                            self.sender.send(specs))
            await self.client.finish_weight_update(weight_version=f"v{version}")
        except BaseException:
            self.connected = False  # a peer may be stuck in the collective: this group is done
            await self.sender.close()
            raise

    async def close(self) -> None:
        if self.connected:
            self.connected = False
            with contextlib.suppress(VLLMError):  # vLLM is gone or mid-round; its group goes with it
                await self.client.shutdown_weight_transfer_engine()
        await self.sender.close()


async def _together(*calls: Any) -> None:
    """Run the calls concurrently; the first failure cancels the others and is raised (a peer that waits for a
    collective never returns by itself)."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        for task in done:
            task.result()
        if pending:  # pragma: no cover - FIRST_EXCEPTION returns early only on a failure, raised above
            await asyncio.gather(*pending)
    finally:
        for task in tasks:
            task.cancel()


def native_sync(client: VLLMClient, source: NamedTensorSource, settings: VLLMSettings,
                device: torch.device | str = "cuda") -> VLLMNativeSync:
    """The seam as ``generator.vllm`` configures it (``weight_transfer: nccl``): tensors cast to vLLM's dtype
    (``auto`` sends the learner's own), ``nccl_buffer_mib`` buffers, the push bounded by ``sync_timeout_s`` and
    the rendezvous by ``control_timeout_s``."""
    sender = TorchNcclSender(source, device=device, dtype=DTYPES.get(settings.dtype),
                             buffer_bytes=settings.nccl_buffer_mib << 20)
    return VLLMNativeSync(client, sender, timeout_s=settings.sync_timeout_s,
                          init_timeout_s=settings.control_timeout_s, pause_mode=settings.pause_mode)


def vllm_args() -> list[str]:
    """The flags vLLM needs for this seam (besides ``VLLM_SERVER_DEV_MODE=1`` in its environment)."""
    return ["--weight-transfer-config", '{"backend": "nccl"}']
