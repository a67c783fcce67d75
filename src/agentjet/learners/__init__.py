"""Learners: the training role (``agentjet.engines.base.Learner``). Both run the one policy step
(``agentjet.learners.policy_step.run_policy_step``):

- :class:`~agentjet.learners.inprocess.InProcessLearner`: in the server's process, on one device; it may share its
  module with the embedded generator (the single-process layout) or hold its own (beside vLLM);
- :class:`~agentjet.distributed.learner.GroupLearner`: an FSDP2 trainer group under torchrun (``agentjet.distributed``).
"""

from agentjet.learners.inprocess import InProcessLearner

__all__ = ["InProcessLearner"]
