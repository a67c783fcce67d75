"""Launching ranks with ``torch.distributed.run`` (torchrun).

The server's node is started by :class:`~agentjet.distributed.group.TrainerGroup` itself. Every other node of a
several-node group runs ``python -m agentjet.distributed.launch`` (see docs/distributed.md): it runs torchrun
for its node, and runs it again whenever it ends with a failure (the server restarts the whole group after a
fault), until the server shuts the group down cleanly.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from agentjet.distributed.messages import TOKEN_ENV


def torchrun_command(*, procs: int, nnodes: int, node_rank: int, rdzv_endpoint: str | None, control: str,
                     python: str = sys.executable) -> list[str]:
    """The command line of one node's torchrun. One node without an endpoint gets a standalone rendezvous on
    a free port. Several nodes meet at ``rdzv_endpoint`` (node 0's address) with torchrun's static rendezvous,
    where ranks follow node ranks: global rank 0, which writes the exported weights, is on node 0. torchrun
    itself never restarts ranks (``--max-restarts 0``): the parent decides."""
    cmd = [python, "-m", "torch.distributed.run", f"--nproc-per-node={procs}", f"--nnodes={nnodes}",
           f"--node-rank={node_rank}", "--max-restarts=0", "--monitor-interval=0.2"]
    if rdzv_endpoint is None:
        if nnodes != 1:
            raise ValueError("a group of several nodes needs a rendezvous endpoint")
        cmd.append("--standalone")
    else:
        cmd += ["--rdzv-backend=static", f"--rdzv-endpoint={rdzv_endpoint}"]
    return [*cmd, "-m", "agentjet.distributed.worker", "--control", control]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run this node's ranks of a trainer group (a node other than the "
                                "server's). The shared secret comes from $" + TOKEN_ENV + ".")
    p.add_argument("--control", required=True, help="the server's HOST:PORT for ranks (its control_host/port)")
    p.add_argument("--nproc-per-node", type=int, required=True)
    p.add_argument("--nnodes", type=int, required=True)
    p.add_argument("--node-rank", type=int, required=True)
    p.add_argument("--rdzv-endpoint", required=True, help="HOST:PORT of the torchrun rendezvous (on node 0)")
    p.add_argument("--once", action="store_true", help="run torchrun once instead of re-joining after a failure")
    p.add_argument("--retry-delay", type=float, default=2.0)
    args = p.parse_args(argv)
    if not os.environ.get(TOKEN_ENV):
        p.error(f"set {TOKEN_ENV} to the server's trainer auth token")
    cmd = torchrun_command(procs=args.nproc_per_node, nnodes=args.nnodes, node_rank=args.node_rank,
                           rdzv_endpoint=args.rdzv_endpoint, control=args.control)
    while True:
        code = subprocess.call(cmd)
        if code == 0 or args.once:
            return code
        print(f"torchrun exited with {code}; re-joining the group in {args.retry_delay:.0f} s", file=sys.stderr)
        time.sleep(args.retry_delay)


if __name__ == "__main__":
    sys.exit(main())
