"""A trainer group: FSDP2 (``fully_shard``) ranks under ``torch.distributed.run``, driven by the server.

- :class:`TrainerGroup` (``group.py``): the parent side; ``train_step``, ``save``/``load``, weight export.
- ``worker.py``: a rank (run by torchrun); ``launch.py``: torchrun command lines, the launcher for other nodes.
- ``plan.py``: how a batch is split across ranks; ``weights.py``: safetensors export and in-place loading.
- :class:`GroupEngine` (``engine.py``): an Engine that generates with the embedded engine and trains with a group.
"""

from agentjet.distributed.group import GroupState, GroupTimeout, RankFailure, TrainerGroup, TrainerGroupError
from agentjet.distributed.weights import copy_weights_into
from agentjet.settings import TrainerGroupSettings

__all__ = ["GroupState", "GroupTimeout", "RankFailure", "TrainerGroup", "TrainerGroupError", "TrainerGroupSettings",
           "copy_weights_into"]
