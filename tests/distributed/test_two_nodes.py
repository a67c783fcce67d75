"""Two "nodes" on one machine: the server's node (node 0, started by the group) and another node's launcher
(``python -m agentjet.distributed.launch``), meeting at a static torchrun rendezvous. A rank killed on the other
node fails the step; the launcher there re-joins the restarted group, and training goes on."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from tests.distributed.conftest import WEIGHT_ATOL, max_weight_diff, train_config

from agentjet.distributed import LearnerGroupSettings, RankFailure, TrainerGroup
from agentjet.runtime.launch import free_port

pytestmark = pytest.mark.timeout(400)


def test_two_nodes_by_rendezvous_survive_a_lost_rank(tiny_model_path: Path, tmp_path: Path, batches, reference) -> None:
    rdzv, control = free_port(), free_port()
    settings = LearnerGroupSettings(procs=1, nnodes=2, node_rank=0, rdzv_endpoint=f"127.0.0.1:{rdzv}",
                                    control_port=control, auth_token="two-node-test", work_dir=tmp_path / "work",
                                    startup_timeout_s=150, step_timeout_s=60, collective_timeout_s=30)
    env = {**os.environ, "AGENTJET_LEARNER__GROUP__AUTH_TOKEN": "two-node-test"}
    node1_log = (tmp_path / "node1.log").open("wb")
    node1 = subprocess.Popen(
        [sys.executable, "-m", "agentjet.distributed.launch", "--control", f"127.0.0.1:{control}",
         "--nproc-per-node", "1", "--nnodes", "2", "--node-rank", "1", "--rdzv-endpoint", f"127.0.0.1:{rdzv}",
         "--retry-delay", "0.5"], env=env, stdout=subprocess.DEVNULL, stderr=node1_log)
    try:
        with TrainerGroup(tiny_model_path, settings, train_config()) as group:
            group.start()
            assert [r for r, _, _ in group.rank_processes] == [0, 1]
            group.train_step(batches[0])
            os.kill(group.rank_processes[1][2], signal.SIGKILL)  # the other node's rank
            with pytest.raises(RankFailure, match="rank 1"):
                group.train_step(batches[1])
            group.train_step(batches[1])  # node 1's launcher re-joined the restarted group
            _, ref_state = reference(batches[:2])
            assert max_weight_diff(group.latest_weights, ref_state) < WEIGHT_ATOL
        assert group.exit_codes[-1] == 0
        assert node1.wait(timeout=60) == 0  # a clean shutdown ends the other node's launcher too
    finally:
        if node1.poll() is None:
            node1.kill()
        node1_log.close()
