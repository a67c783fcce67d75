"""A trainer group: FSDP2 (``fully_shard``) ranks under ``torch.distributed.run``, driven by the server.

- :class:`TrainerGroup` (``group.py``): the parent side; ``train_step``, ``score``, ``save``/``load``, weight
  export.
- ``worker.py``: a rank (run by torchrun); ``launch.py``: torchrun command lines, the launcher for other nodes.
- ``plan.py``: how a batch is split across ranks.

The learner that wraps a group for the server is ``agentjet.distributed.learner.GroupLearner``; weight files are
written and read by ``agentjet.weights.io``.
"""

from agentjet.distributed.group import GroupState, TrainerGroup
from agentjet.distributed.ranks import GroupTimeout, RankFailure, TrainerGroupError
from agentjet.settings import TrainerGroupSettings

__all__ = ["GroupState", "GroupTimeout", "RankFailure", "TrainerGroup", "TrainerGroupError", "TrainerGroupSettings"]
