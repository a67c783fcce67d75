"""The protobuf side of the Tinker API, with the SDK's own schema (``tinker.proto.tinker_public_pb2``): a
``forward_backward`` request body in, a ``ForwardBackwardOutput`` out. Imported only when a request needs it (the
``tinker`` extra)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from agentjet.learners.tinker_ops import FwdBwdResult, TinkerDatum
from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.samplers import SampleResult


@dataclass
class FwdBwdRequest:
    model_id: str
    seq_id: int | None
    loss_fn: str
    config: dict[str, float]
    forward_only: bool
    data: list[TinkerDatum]


def _pb() -> Any:
    try:
        from tinker.proto import tinker_public_pb2
    except ImportError as e:  # pragma: no cover - the extra is missing
        raise TinkerError("forward_backward needs the tinker extra on the server (pip install agentjet[tinker])",
                          501) from e
    return tinker_public_pb2


def _tensor(pb: Any, msg: Any, name: str) -> list[float]:
    dtypes = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}
    if msg.WhichOneof("encoding") != "dense":
        if msg.WhichOneof("encoding") == "sparse_csr":
            raise TinkerError(f"loss_fn_inputs[{name!r}]: sparse tensors are not supported here")
        return []
    dtype = dtypes.get(msg.dtype)
    if dtype is None:
        raise TinkerError(f"loss_fn_inputs[{name!r}]: unsupported dtype {msg.dtype}")
    if len(msg.dense) % np.dtype(dtype).itemsize:
        raise TinkerError(f"loss_fn_inputs[{name!r}]: its bytes are not whole {np.dtype(dtype).name} values")
    arr = np.frombuffer(msg.dense, dtype=dtype)
    if len(msg.shape) > 1:
        raise TinkerError(f"loss_fn_inputs[{name!r}]: only 1-d tensors are supported (shape {list(msg.shape)})")
    return arr.tolist()


def parse_forward_backward(body: bytes) -> FwdBwdRequest:
    pb = _pb()
    msg = pb.ForwardBackwardRequest()
    try:
        msg.ParseFromString(body)
    except Exception as e:  # noqa: BLE001 - the protobuf runtime raises its own DecodeError
        raise TinkerError(f"the body is not a ForwardBackwardRequest protobuf: {e}") from e
    if not msg.model_id:
        raise TinkerError("model_id is missing")
    config: dict[str, float] = {k: float(v) for k, v in msg.loss_fn_config.items()}
    for k, v in msg.loss_fn_config_v2.items():
        if v.WhichOneof("value") == "number":
            config[k] = float(v.number)
    data = []
    for i, d in enumerate(msg.data):
        tokens: list[int] = []
        for chunk in d.model_input:
            kind = chunk.WhichOneof("chunk")
            if kind != "encoded_text":
                raise TinkerError(f"datum {i}: only encoded text chunks are supported (got {kind})")
            raw = chunk.encoded_text.tokens
            if len(raw) % 4:
                raise TinkerError(f"datum {i}: its token bytes are not whole int32 values")
            tokens.extend(np.frombuffer(raw, dtype=np.int32).tolist())
        inputs = {name: _tensor(pb, t, name) for name, t in d.loss_fn_inputs.items()}
        if "target_tokens" not in inputs:
            raise TinkerError(f"datum {i}: loss_fn_inputs has no target_tokens")
        data.append(TinkerDatum(tokens=tokens, target_tokens=[int(t) for t in inputs["target_tokens"]],
                                weights=inputs.get("weights"), logprobs=inputs.get("logprobs"),
                                advantages=inputs.get("advantages")))
    return FwdBwdRequest(msg.model_id, msg.seq_id or None, msg.loss_fn, config, bool(msg.forward_only), data)


def _batched(pb: Any, rows: list[list[float]]) -> Any:
    flat = np.concatenate([np.asarray(r, dtype=np.float32) for r in rows]) if rows else np.zeros(0, np.float32)
    offsets = np.cumsum([0] + [4 * len(r) for r in rows]).astype(np.int64)
    return pb.BatchedTensor(data=flat.tobytes(), offsets=offsets.tobytes(), dtype=pb.DTYPE_FLOAT32)


def encode_forward_backward(result: FwdBwdResult) -> bytes:
    pb = _pb()
    record = pb.ArrayRecord(num_datums=len(result.logprobs),
                            fields={"logprobs": _batched(pb, result.logprobs),
                                    "elementwise_loss": _batched(pb, result.elementwise_loss)})
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord", loss_fn_outputs=[record],
                                   metrics={"loss:sum": result.loss_sum})
    return bytes(out.SerializeToString())


def _topk(pb: Any, rows: list[list[tuple[int, float]]]) -> Any:
    """The schema's dense N x K top-k matrices; empty cells are token 0, logprob -99999."""
    k = max((len(r) for r in rows), default=0)
    ids = np.zeros((len(rows), k), dtype=np.int32)
    lps = np.full((len(rows), k), -99999.0, dtype=np.float32)
    for i, row in enumerate(rows):
        for j, (tok, lp) in enumerate(row):
            ids[i, j], lps[i, j] = tok, lp
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def encode_sample(result: SampleResult) -> bytes:
    pb = _pb()
    out = pb.SampleResponse()
    for seq in result.sequences:
        s = out.sequences.add(stop_reason=pb.STOP_REASON_STOP if seq.stop else pb.STOP_REASON_LENGTH,
                              tokens=np.asarray(seq.tokens, dtype=np.int32).tobytes(),
                              logprobs=np.asarray(seq.logprobs, dtype=np.float32).tobytes())
        if seq.topk is not None:
            s.topk_sampled_logprobs.CopyFrom(_topk(pb, seq.topk))
    if result.prompt_logprobs is not None:
        out.prompt_logprobs = np.asarray(result.prompt_logprobs, dtype=np.float32).tobytes()
    if result.topk_prompt is not None:
        out.topk_prompt_logprobs.CopyFrom(_topk(pb, result.topk_prompt))
    return bytes(out.SerializeToString())
