"""The training core, in small parts named for what they do:

- ``pool.GroupPool``: acknowledged episodes waiting to train, grouped by group key; the admission order, the
  task-type quotas, batch selection, and the drops (stale, uniform). Admission reads it; the loop takes from it.
- ``step.BatchStep``: one train step on a batch of groups: advantages, the staleness mask, the learner's
  ``train_step``, and the commit (store, counters, observer, a scheduled checkpoint).
- ``loop.TrainLoop``: when to step: wake-ups, passes, pause and resume, the step lock, halts.
- ``checkpoints.Checkpoints``: save, prune and resume (the layout itself: ``checkpoints.layout``).

None of them trains a model: the learner does (``agentjet.learners``).
"""
