"""External weights (``save_weights_external``): a training client's adapter as a standard PEFT adapter directory
(``adapter_config.json``, ``adapter_model.safetensors``), optionally age-encrypted to the caller's recipients, at
``tinker://<adapter>/external_weights/<name>`` (``<data dir>/tinker/<adapter>/external_weights/<name>/``). The SDK's
REST client gets a signed URL per file (``external_weights_urls``), which any HTTP client fetches without the API key
(``tinker_cookbook.weights.download`` uses ``urllib``); it can set the export's TTL and delete it."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import hmac
import json
import re
import shutil
from pathlib import Path
from typing import Any
from urllib.parse import quote

from agentjet.files import atomic_dir, write_atomic
from agentjet.learners.tinker_ops import export_adapter
from agentjet.runtime.clock import Clock
from agentjet.server.tinker.errors import TinkerError
from agentjet.server.tinker.models import TinkerModel, TinkerModels
from agentjet.server.tinker.runs import RUN_ID

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}$")
URL_TTL_S = 3600  # a signed URL's life (wall clock: the SDK compares it with its own)
MIN_TTL_S, MAX_TTL_S = 3600, 10 * 365 * 86400  # the SDK's bounds on a checkpoint's TTL
AGE_SUFFIX = ".age"


def _iso(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).isoformat()


def _encrypt(directory: Path, recipients: list[str]) -> None:
    """Every file of ``directory`` age-encrypted to ``recipients`` (``age1...`` or SSH keys), as ``<file>.age``."""
    import pyrage

    parsed: list[Any] = []
    for r in recipients:
        try:
            parsed.append(pyrage.ssh.Recipient.from_str(r) if r.startswith("ssh-")
                          else pyrage.x25519.Recipient.from_str(r))
        except Exception as e:  # noqa: BLE001 - pyrage's own error types
            raise ValueError(f"age_encryption_recipients: {r[:20]!r}... is not an age or SSH public key ({e})") from e
    for f in sorted(p for p in directory.iterdir() if p.is_file()):
        f.with_name(f.name + AGE_SUFFIX).write_bytes(pyrage.encrypt(f.read_bytes(), parsed))
        f.unlink()


class ExternalWeights:
    def __init__(self, models: TinkerModels, data_dir: Path, secret: bytes, clock: Clock) -> None:
        self.models = models
        self.data_dir = data_dir
        self.secret = secret  # signs the download URLs (the server's Tinker key)
        self.clock = clock

    def _dir(self, run_id: str, name: str) -> Path:
        if not _NAME.match(name) or not RUN_ID.match(run_id):
            raise TinkerError(f"tinker://{run_id}/external_weights/{name} is not an external weights path")
        return self.data_dir / run_id / "external_weights" / name

    def _meta_file(self, run_id: str, name: str) -> Path:
        return self._dir(run_id, name).with_name(f"{name}.json")

    async def save(self, model: TinkerModel, name: str, ttl_seconds: int | None,
                   recipients: list[str] | None) -> dict[str, Any]:
        if not _NAME.match(name):
            raise TinkerError("an external weights name is letters, digits, _ . and - (at most 100)")
        expires = self._expiry(ttl_seconds)
        learner = self.models.learner(model)
        target = self._dir(model.adapter, name)
        with atomic_dir(target) as tmp:  # an export of the same name is replaced
            await learner.worker.run(export_adapter, learner, tmp)
            if recipients:
                await asyncio.to_thread(_encrypt, tmp, recipients)
        write_atomic(self._meta_file(model.adapter, name), json.dumps({"expires": expires}))
        size = sum(f.stat().st_size for f in target.iterdir())
        path = f"tinker://{model.adapter}/external_weights/{name}"
        self.models.runs.checkpointed(model.adapter, f"external_weights/{name}", path, size,
                                      None if expires is None else _iso(expires))
        return {"type": "save_weights_external", "path": path, "size_bytes": size}

    def _expiry(self, ttl_seconds: int | None) -> float | None:
        if ttl_seconds is None:
            return None
        if not MIN_TTL_S <= ttl_seconds <= MAX_TTL_S:
            raise TinkerError(f"ttl_seconds must be in {MIN_TTL_S}..{MAX_TTL_S} (or null: no expiry)")
        return self.clock.time() + ttl_seconds

    def _live(self, run_id: str, name: str) -> Path:
        """The export's directory; an expired one is deleted (and is then unknown)."""
        directory = self._dir(run_id, name)
        meta = self._meta_file(run_id, name)
        expires = json.loads(meta.read_text()).get("expires") if meta.is_file() else None
        if expires is not None and self.clock.time() > expires:
            self.delete(run_id, name)
        if not directory.is_dir():
            raise TinkerError(f"no external weights at tinker://{run_id}/external_weights/{name}", 404)
        return directory

    def _sign(self, run_id: str, name: str, file: str, expires: int) -> str:
        return hmac.new(self.secret, f"{run_id}/{name}/{file}:{expires}".encode(), hashlib.sha256).hexdigest()

    def urls(self, run_id: str, name: str, base_url: str) -> dict[str, Any]:
        """The SDK's ``ExternalWeightsUrlsResponse``: a signed URL per file of the export."""
        directory = self._live(run_id, name)
        expires = int(self.clock.time()) + URL_TTL_S
        base = base_url.rstrip("/")
        urls = {f.name: f"{base}/api/v1/external_weights/{quote(run_id)}/{quote(name)}/{quote(f.name)}"
                        f"?expires={expires}&sig={self._sign(run_id, name, f.name, expires)}"
                for f in sorted(directory.iterdir()) if f.is_file()}
        return {"urls": urls, "expires": _iso(expires)}

    def signed_file(self, run_id: str, name: str, file: str, expires: int, sig: str) -> Path:
        """A file behind a signed URL: the signature must match and the URL must not have expired."""
        if not hmac.compare_digest(sig, self._sign(run_id, name, file, expires)):
            raise TinkerError("this download URL's signature does not match (ask for new URLs)", 403)
        if self.clock.time() > expires:
            raise TinkerError("this download URL has expired (ask for new URLs: external_weights_urls)", 403)
        path = self._live(run_id, name) / file
        if "/" in file or file.startswith(".") or not path.is_file():
            raise TinkerError(f"no file {file!r} in tinker://{run_id}/external_weights/{name}", 404)
        return path

    def set_ttl(self, run_id: str, name: str, ttl_seconds: int | None) -> None:
        self._live(run_id, name)
        write_atomic(self._meta_file(run_id, name), json.dumps({"expires": self._expiry(ttl_seconds)}))

    def delete(self, run_id: str, name: str) -> None:
        directory = self._dir(run_id, name)
        if not directory.is_dir():
            raise TinkerError(f"no external weights at tinker://{run_id}/external_weights/{name}", 404)
        shutil.rmtree(directory)
        self._meta_file(run_id, name).unlink(missing_ok=True)
        self.models.runs.forget_checkpoint(run_id, f"external_weights/{name}")
