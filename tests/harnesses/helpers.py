"""What the harness tests put around a real CLI:

- ``RecordingProxy``: a reverse proxy in front of a live ``ajet server`` that records every call a CLI makes (route,
  status, content type, the request body), so a test sees each answer as the CLI got it;
- ``NetTrap``: the proxy a CLI is given in ``HTTPS_PROXY``/``HTTP_PROXY`` (loopback stays direct through
  ``NO_PROXY``): any connection it tries beyond this machine lands here, is refused and recorded;
- ``ScriptedStub``: a logging stand-in for a model server, answering the Responses and Messages APIs from a script
  (text, or a tool call), to see what a CLI sends and what its own sandbox lets a tool call do. It is a probe of
  the CLIs, not of AgentJet: the tests of AgentJet's routes run against the live server.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import aiohttp
from aiohttp import web

HOP_HEADERS = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "accept-encoding",
               "content-encoding", "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection"}
MODEL_ROUTES = ("/v1/responses", "/v1/messages", "/v1/chat/completions", "/v1/completions")


@dataclass
class Call:
    """One request a CLI made, and the answer it got."""

    method: str
    path: str  # with the query string
    status: int
    content_type: str
    request: Any  # the JSON body (None: none, or not JSON)
    request_bytes: int
    response: bytes
    seconds: float
    headers: dict[str, str] = field(default_factory=dict)
    client_gone: str | None = None  # the client hung up before the whole answer was written to it

    @property
    def route(self) -> str:
        return self.path.split("?", 1)[0]

    @property
    def is_model_call(self) -> bool:
        return self.method == "POST" and self.route in MODEL_ROUTES

    @property
    def streamed(self) -> bool:
        return self.content_type.startswith("text/event-stream")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        return None


class RecordingProxy:
    """``http://127.0.0.1:<port>`` forwarding everything to ``upstream`` (streams passed through as they come)."""

    def __init__(self, upstream: str | None = None) -> None:
        self.upstream = upstream
        self.calls: list[Call] = []
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RecordingProxy:
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the recording proxy did not start")
        return self

    def stop(self) -> None:
        if self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    def model_calls(self) -> list[Call]:
        with self._lock:
            return [c for c in self.calls if c.is_model_call]

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_until_complete(self._main())

    async def _main(self) -> None:
        self._stop = asyncio.Event()
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        timeout = aiohttp.ClientTimeout(total=None, sock_read=1800)
        async with aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as self._session:
            self._ready.set()
            await self._stop.wait()
        await runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        assert self.upstream is not None, "set the upstream before the first request"
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        start = time.monotonic()
        received = bytearray()
        status, content_type, gone, delivered = 502, "", None, False
        out: web.StreamResponse | None = None
        try:
            async with self._session.request(request.method, self.upstream + request.path_qs, headers=headers,
                                             data=body) as up:
                status, content_type = up.status, up.headers.get("content-type", "")
                out = web.StreamResponse(status=up.status, headers={k: v for k, v in up.headers.items()
                                                                    if k.lower() not in HOP_HEADERS})
                await out.prepare(request)
                async for chunk in up.content.iter_any():
                    received += chunk
                    await out.write(chunk)
                delivered = True  # every byte written; a client that hangs up now (Codex, once it has read
                await out.write_eof()  # response.completed) misses only the end of the chunked body
                return out
        except (ConnectionResetError, aiohttp.ClientConnectionResetError) as exc:
            if not delivered:
                gone = f"the client closed the connection after {time.monotonic() - start:.1f} s: {exc}"
                raise
            assert out is not None
            return out
        finally:
            with self._lock:
                self.calls.append(Call(request.method, request.path_qs, status, content_type, _json(body), len(body),
                                       bytes(received), time.monotonic() - start, dict(request.headers), gone))


class NetTrap:
    """A forward proxy that refuses everything and records what was asked of it (``CONNECT host:443``, or an
    absolute URL). ``env`` is what a CLI needs to send everything but loopback here."""

    def __init__(self) -> None:
        self.attempts: list[str] = []
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen()
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._closed = False

    @property
    def env(self) -> dict[str, str]:
        url = f"http://127.0.0.1:{self.port}"
        loop = "127.0.0.1,localhost,::1"
        return {"HTTPS_PROXY": url, "HTTP_PROXY": url, "ALL_PROXY": url, "https_proxy": url, "http_proxy": url,
                "all_proxy": url, "NO_PROXY": loop, "no_proxy": loop}

    def start(self) -> NetTrap:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._closed = True
        self._sock.close()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                try:
                    line = conn.recv(4096).split(b"\r\n", 1)[0].decode("latin-1")
                    conn.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                except OSError:
                    line = "(no request line)"
                self.attempts.append(line)


@dataclass
class Reply:
    """One scripted answer: ``text``, or a tool call ``tool`` with ``arguments``."""

    text: str = "done"
    tool: str | None = None
    arguments: dict[str, Any] = field(default_factory=dict)


class ScriptedStub:
    """A model server for probing CLIs: answers ``POST .../responses``, ``.../messages`` (and ``count_tokens``)
    with the script's replies in turn (the last one once it runs out), streamed when asked, and logs every request."""

    def __init__(self, script: list[Reply] | None = None) -> None:
        self.script = list(script or [Reply()])
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:
                stub._log(self, b"")
                self.send_response(200)
                self.send_header("content-length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                stub._log(self, b"")
                stub._send_json(self, 200, {"object": "list", "data": []})

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("content-length") or 0))
                body = stub._log(self, raw) or {}
                route = self.path.split("?", 1)[0]
                if route.endswith("/messages/count_tokens"):
                    return stub._send_json(self, 200, {"input_tokens": len(raw) // 4})
                reply = stub._next()
                if route.endswith("/messages"):
                    return stub._messages(self, body, reply)
                if route.endswith("/responses"):
                    return stub._responses(self, body, reply)
                stub._send_json(self, 404, {"error": {"message": f"no route {route}"}})

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> ScriptedStub:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def posts(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self.requests if r["method"] == "POST"]

    def _log(self, handler: BaseHTTPRequestHandler, raw: bytes) -> Any:
        body = _json(raw)
        with self._lock:
            self.requests.append({"method": handler.command, "path": handler.path, "headers": dict(handler.headers),
                                  "bytes": len(raw), "body": body})
        return body

    def _next(self) -> Reply:
        with self._lock:
            n = sum(1 for r in self.requests if r["method"] == "POST" and "count_tokens" not in r["path"])
        return self.script[min(n, len(self.script)) - 1]

    @staticmethod
    def _send_json(handler: BaseHTTPRequestHandler, code: int, obj: Any) -> None:
        data = json.dumps(obj).encode()
        handler.send_response(code)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)

    @staticmethod
    def _send_events(handler: BaseHTTPRequestHandler, events: list[dict[str, Any]]) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("connection", "close")
        handler.end_headers()
        for event in events:
            handler.wfile.write(f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode())
        handler.wfile.flush()
        handler.close_connection = True

    def _messages(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], reply: Reply) -> None:
        if reply.tool:
            block: dict[str, Any] = {"type": "tool_use", "id": f"toolu_{len(self.requests)}", "name": reply.tool,
                                     "input": reply.arguments}
            start: dict[str, Any] = {**block, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(reply.arguments)}
            stop = "tool_use"
        else:
            block = {"type": "text", "text": reply.text}
            start = {"type": "text", "text": ""}
            delta = {"type": "text_delta", "text": reply.text}
            stop = "end_turn"
        message = {"id": "msg_1", "type": "message", "role": "assistant", "model": body.get("model", "stub"),
                   "content": [block], "stop_reason": stop, "stop_sequence": None,
                   "usage": {"input_tokens": 1, "output_tokens": 1}}
        if not body.get("stream"):
            return self._send_json(handler, 200, message)
        self._send_events(handler, [
            {"type": "message_start", "message": {**message, "content": [], "stop_reason": None}},
            {"type": "content_block_start", "index": 0, "content_block": start},
            {"type": "content_block_delta", "index": 0, "delta": delta},
            {"type": "content_block_stop", "index": 0},
            {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
             "usage": {"output_tokens": 1}},
            {"type": "message_stop"}])

    def _responses(self, handler: BaseHTTPRequestHandler, body: dict[str, Any], reply: Reply) -> None:
        if reply.tool:
            n = len(self.requests)
            item: dict[str, Any] = {"type": "function_call", "id": f"fc_{n}", "call_id": f"call_{n}", "name": reply.tool,
                                    "arguments": json.dumps(reply.arguments), "status": "completed"}
        else:
            item = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": reply.text, "annotations": []}]}
        response = {"id": f"resp_{len(self.requests)}", "object": "response", "created_at": int(time.time()),
                    "status": "completed", "model": body.get("model", "stub"), "output": [item],
                    "usage": {"input_tokens": 1, "output_tokens": 1, "total_tokens": 2,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}
        if not body.get("stream"):
            return self._send_json(handler, 200, response)
        pending = {**response, "status": "in_progress", "output": [], "usage": None}
        self._send_events(handler, [
            {"type": "response.created", "sequence_number": 0, "response": pending},
            {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0, "item": item},
            {"type": "response.output_item.done", "sequence_number": 2, "output_index": 0, "item": item},
            {"type": "response.completed", "sequence_number": 3, "response": response}])
