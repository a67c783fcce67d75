"""The parent's connections to the ranks of a trainer group: a listener the ranks dial (authenticated by the
group's token), the ranks in order once each has said hello, and every send and gather with a deadline (a hung
rank or collective becomes a :class:`GroupTimeout`, never a hang)."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from multiprocessing.connection import wait as wait_connections
from pathlib import Path

from agentjet.distributed.messages import Command, Done, Failed, Hello


class TrainerGroupError(RuntimeError):
    """A trainer-group operation failed and was not applied. ``restarted`` says whether the group is running
    again (from its last recovery point) when this is raised."""

    restarted: bool = False


class RankFailure(TrainerGroupError):
    """A rank died, closed its connection, or reported an exception."""


class GroupTimeout(TrainerGroupError):
    """The ranks did not answer within a deadline (a hung rank or collective)."""


@dataclass(frozen=True)
class Rank:
    rank: int
    conn: Connection
    host: str
    pid: int


class RankChannel:
    """``tail()`` gives the ranks' latest output for error messages; ``check()`` raises when torchrun is gone."""

    def __init__(self, host: str, port: int, token: str, world_size: int, *, tail: Callable[[], str],
                 check: Callable[[str], None]) -> None:
        self.host, self.port = host, port
        self.token = token
        self.world_size = world_size
        self.ranks: list[Rank] = []
        self._tail = tail
        self._check = check
        self._listener: Listener | None = None
        self._accepted: queue.Queue[Connection] = queue.Queue()
        self._stop_accepting = threading.Event()

    # ------------------------------------------------------------ the listener
    def address(self) -> tuple[str, int]:
        """Where the ranks dial (the listener starts on first use)."""
        if self._listener is None:
            self._listener = Listener((self.host, self.port), family="AF_INET", authkey=self.token.encode())
            self._stop_accepting.clear()
            threading.Thread(target=self._accept_loop, args=(self._listener,), name="agentjet-trainer-accept",
                             daemon=True).start()
        host, port = self._listener.address
        return ("127.0.0.1" if host in ("0.0.0.0", "") else host), port

    def _accept_loop(self, listener: Listener) -> None:
        while not self._stop_accepting.is_set():
            try:
                conn = listener.accept()
            except OSError:
                if self._stop_accepting.is_set():
                    return
                continue
            except Exception:  # a client that failed the handshake (wrong token, dropped)
                continue
            if self._stop_accepting.is_set():
                conn.close()
                return
            self._accepted.put(conn)

    def stop(self) -> None:
        if self._listener is None:
            return
        self._stop_accepting.set()
        host, port = self._listener.address
        with contextlib.suppress(Exception):  # wake the blocked accept()
            Client(("127.0.0.1" if host in ("0.0.0.0", "") else host, port), family="AF_INET",
                   authkey=self.token.encode()).close()
        with contextlib.suppress(Exception):
            self._listener.close()
        self._listener = None

    def drop_stale(self) -> None:
        """Close connections left from a dead generation."""
        while not self._accepted.empty():
            with contextlib.suppress(Exception):
                self._accepted.get_nowait().close()

    def accept(self, deadline: float, timeout_s: float) -> None:
        """Wait for every rank's hello (by ``deadline``)."""
        ranks: dict[int, Rank] = {}
        while len(ranks) < self.world_size:
            self._check("starting")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise GroupTimeout(f"{len(ranks)} of {self.world_size} ranks connected within "
                                   f"{timeout_s:.0f} s{self._tail()}")
            try:
                conn = self._accepted.get(timeout=min(remaining, 0.2))
            except queue.Empty:
                continue
            try:
                hello = conn.recv() if conn.poll(max(remaining, 0.01)) else None
            except (EOFError, OSError):
                hello = None
            if not isinstance(hello, Hello) or hello.world_size != self.world_size or hello.rank in ranks:
                conn.close()
                raise RankFailure(f"a rank connected with {hello!r}; expected a Hello from one of "
                                  f"{self.world_size} ranks")
            ranks[hello.rank] = Rank(hello.rank, conn, hello.host, hello.pid)
        self.ranks = [ranks[i] for i in range(self.world_size)]

    def kill(self) -> None:
        """Close the connections and SIGKILL every local rank of this generation."""
        for r in self.ranks:
            with contextlib.suppress(Exception):
                r.conn.close()
        host = socket.gethostname()
        for r in self.ranks:
            if r.host == host and is_rank_process(r.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(r.pid, signal.SIGKILL)
        self.ranks = []

    # ------------------------------------------------------------ commands
    def send_all(self, make: Callable[[int], Command], deadline: float, what: str) -> None:
        """Send each rank its command. The sends run on a helper thread: a hung rank stops reading and would
        block a send forever; after the deadline the caller kills the group, which unblocks the thread."""
        errors: list[RankFailure] = []

        def send() -> None:
            for r in self.ranks:
                try:
                    r.conn.send(make(r.rank))
                except Exception as exc:
                    errors.append(RankFailure(f"rank {r.rank} (pid {r.pid} on {r.host}) is gone: sending "
                                              f"{what} failed with {type(exc).__name__}: {exc}"))
                    return

        sender = threading.Thread(target=send, name="agentjet-trainer-send", daemon=True)
        sender.start()
        sender.join(timeout=max(0.0, deadline - time.monotonic()))
        if sender.is_alive():
            raise GroupTimeout(f"sending {what} to the ranks did not finish in time (a rank stopped reading)")
        if errors:
            raise errors[0]

    def gather(self, kind: str, deadline: float) -> list[Done]:
        """Every rank's ``Done(kind)``, by rank. A closed connection, a ``Failed`` or the deadline raises."""
        pending = {r.conn: r for r in self.ranks}
        got: dict[int, Done] = {}
        while pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                late = sorted(r.rank for r in pending.values())
                raise GroupTimeout(f"rank(s) {late} did not finish '{kind}' in time (a hung rank or "
                                   f"collective){self._tail()}")
            problems: list[str] = []
            reported: set[int] = set()
            for conn in wait_connections(list(pending), timeout=min(remaining, 0.5)):
                r = pending.pop(conn)  # type: ignore[call-overload]
                try:
                    msg = conn.recv()  # type: ignore[union-attr]
                except (EOFError, OSError):
                    problems.append(f"rank {r.rank} (pid {r.pid} on {r.host}) closed its connection")
                    continue
                if isinstance(msg, Failed):
                    reported.add(r.rank)
                    problems.append(f"rank {msg.rank} failed ({msg.kind}): {msg.error}")
                elif not (isinstance(msg, Done) and msg.kind == kind):
                    problems.append(f"rank {r.rank} answered {msg!r}")
                else:
                    got[r.rank] = msg
            if problems:
                dead = self._dead_ranks(exclude=reported)
                raise RankFailure(f"during '{kind}': " + "; ".join(dead + problems) + self._tail())
        return [got[i] for i in range(self.world_size)]

    def _dead_ranks(self, exclude: set[int]) -> list[str]:
        """Local ranks whose process is gone (other than those that reported an error and exited): the usual
        root cause when the others report broken collectives."""
        host = socket.gethostname()
        return [f"rank {r.rank} (pid {r.pid}) died" for r in self.ranks
                if r.rank not in exclude and r.host == host and not is_rank_process(r.pid)]


def is_rank_process(pid: int) -> bool:
    """Is ``pid`` (still) one of our rank processes (not a recycled pid)?"""
    try:
        return b"agentjet.distributed.worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
