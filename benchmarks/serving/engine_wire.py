"""The engine process's wire, measured: which encoding and which local socket carry its messages best.

    .venv/bin/python benchmarks/serving/engine_wire.py            # ~30 s on 2 cores

The server and the embedded generator's engine process (``generators/hf/process.py``) exchange three kinds of
frames, here at the shapes of the CPU proxy (c64, 128 new tokens) and of a harness call (12k-token prompt):
- ``request``: one generation request (prompt ids, sampling parameters);
- ``step``: one decode step's stream tokens, 64 rows (request id, token, logprob each);
- ``results``: 64 finished results of 128 tokens (ids, logprobs, per-token versions, text).

Encodings: msgpack (``msgpack``, what the engine process speaks: ``generators/hf/wire.py``) against pickle
(protocol 5, what ``multiprocessing.connection`` sends): µs to encode and decode each frame, and its bytes.

Transports between two processes (a spawned echo peer): a Unix stream socket with a 4-byte length prefix (the
engine process's), ``multiprocessing.connection`` (AF_UNIX, ``send_bytes``/``recv_bytes``), and ZeroMQ PAIR over
``ipc://`` (pyzmq, only when installed). For each: the round trip of a 16-byte ping (µs, median of 2,000) and
one-way ``step`` frames per second (20,000 frames, the peer acknowledges the last). Results:
``benchmarks/results/engine_wire.json`` (machine, commit) and ``docs/benchmarks.md`` ("The engine process").
"""

from __future__ import annotations

import json
import multiprocessing as mp
import pickle
import socket
import statistics
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # workloads.py

from workloads import RESULTS  # noqa: E402

from agentjet.runtime.provenance import git_commit, machine  # noqa: E402

PINGS, FRAMES = 2000, 20_000
HEADER = struct.Struct("<I")


def shapes() -> dict[str, Any]:
    """The three frames, as lists of messages (the engine process batches its messages per flush)."""
    sampling = [1.0, 1.0, 0, 128, [], [2], 1234, 0]
    request = [[1, 7, list(range(100, 1100)), sampling, None, False]]
    harness = [[1, 7, [i % 49152 for i in range(12_000)], sampling, None, True]]
    step = [[2, list(range(64)), [1000 + i for i in range(64)], [-1.234567 - i / 100 for i in range(64)]]]
    results = [[3, rid, [1000 + i for i in range(128)], [-0.5 - i / 1000 for i in range(128)], "length", 0,
                "some text " * 40, None, [0] * 128] for rid in range(64)]
    return {"request": request, "harness_request": harness, "step": step, "results": results}


def codec_costs() -> dict[str, Any]:
    codecs: dict[str, tuple[Callable[[Any], bytes], Callable[[bytes], Any]]] = {
        "msgpack": (msgpack.packb, msgpack.unpackb),
        "pickle": (lambda m: pickle.dumps(m, protocol=5), pickle.loads)}
    out: dict[str, Any] = {}
    for shape, frame in shapes().items():
        for name, (enc, dec) in codecs.items():
            data = enc(frame)
            reps = 2000 if shape in ("request", "step") else 300
            t0 = time.perf_counter()
            for _ in range(reps):
                enc(frame)
            t1 = time.perf_counter()
            for _ in range(reps):
                dec(data)
            t2 = time.perf_counter()
            out[f"{shape}/{name}"] = {"bytes": len(data), "encode_us": (t1 - t0) / reps * 1e6,
                                      "decode_us": (t2 - t1) / reps * 1e6}
    return out


# ---------------------------------------------------------------------- the peers (each in a process of its own)
def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return bytes(buf)


def _framed_recv(sock: socket.socket) -> bytes:
    (n,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    return _recv_exact(sock, n)


def _framed_send(sock: socket.socket, data: bytes) -> None:
    sock.sendall(HEADER.pack(len(data)) + data)


def peer_socket(path: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    _serve(lambda: _framed_recv(sock), lambda b: _framed_send(sock, b))


def peer_connection(path: str) -> None:
    from multiprocessing.connection import Client

    conn = Client(path, family="AF_UNIX")
    _serve(conn.recv_bytes, conn.send_bytes)


def peer_zmq(path: str) -> None:
    import zmq

    sock = zmq.Context().socket(zmq.PAIR)
    sock.connect(f"ipc://{path}")
    _serve(sock.recv, sock.send)


def _serve(recv: Callable[[], bytes], send: Callable[[bytes], Any]) -> None:
    """Echo pings; count a stream of frames and acknowledge its last (b"end")."""
    while True:
        data = recv()
        if data == b"quit":
            return
        if data.startswith(b"ping"):
            send(data)
        elif data == b"end":
            send(b"ack")


def _measure(send: Callable[[bytes], Any], recv: Callable[[], bytes], step: bytes) -> dict[str, float]:
    for _ in range(200):  # warm-up
        send(b"ping-0123456789ab")
        recv()
    rtts = []
    for _ in range(PINGS):
        t0 = time.perf_counter()
        send(b"ping-0123456789ab")
        recv()
        rtts.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(FRAMES):
        send(step)
    send(b"end")
    recv()
    elapsed = time.perf_counter() - t0
    send(b"quit")
    return {"ping_rtt_us_median": statistics.median(rtts) * 1e6,
            "ping_rtt_us_p90": sorted(rtts)[int(0.9 * len(rtts))] * 1e6,
            "step_frames_per_s": FRAMES / elapsed}


def transports() -> dict[str, Any]:
    step = msgpack.packb(shapes()["step"])
    ctx = mp.get_context("spawn")
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "s")
        # a Unix stream socket, length-framed
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(1)
        proc = ctx.Process(target=peer_socket, args=(path,))
        proc.start()
        sock, _ = listener.accept()
        out["unix_socket"] = _measure(lambda b: _framed_send(sock, b), lambda: _framed_recv(sock), step)
        proc.join(30)
        sock.close()
        listener.close()
        # multiprocessing.connection
        from multiprocessing.connection import Listener

        path2 = str(Path(tmp) / "c")
        with Listener(path2, family="AF_UNIX") as lst:
            proc = ctx.Process(target=peer_connection, args=(path2,))
            proc.start()
            conn = lst.accept()
            out["multiprocessing_connection"] = _measure(conn.send_bytes, conn.recv_bytes, step)
            proc.join(30)
        # ZeroMQ PAIR over ipc
        try:
            import zmq
        except ImportError:
            out["zmq_pair_ipc"] = "pyzmq not installed"
        else:
            path3 = str(Path(tmp) / "z")
            zsock = zmq.Context().socket(zmq.PAIR)
            zsock.bind(f"ipc://{path3}")
            proc = ctx.Process(target=peer_zmq, args=(path3,))
            proc.start()
            out["zmq_pair_ipc"] = _measure(zsock.send, zsock.recv, step)
            proc.join(30)
    return out


def main() -> None:
    result = {"machine": machine(), "commit": git_commit(), "python": sys.version.split()[0],
              "msgpack": ".".join(map(str, msgpack.version)), "codecs": codec_costs(), "transports": transports()}
    try:
        import zmq

        result["pyzmq"] = zmq.__version__
    except ImportError:
        pass
    for key, row in result["codecs"].items():
        print(f"  {key:28s} {row['bytes']:8d} B  encode {row['encode_us']:8.1f} us  decode {row['decode_us']:8.1f} us")
    for key, row in result["transports"].items():
        print(f"  {key:28s} {row}")
    out = RESULTS / "engine_wire.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
