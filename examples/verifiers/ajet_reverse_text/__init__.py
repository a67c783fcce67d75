"""A small offline verifiers 0.4 taskset: reverse a word, scored by similarity to the reversed word.

The example environment of AgentJet's verifiers runner (``ajet verifiers``, docs/environments.md). A taskset is
a package that exports its ``Taskset`` subclass in ``__all__``; its id is the package name
(``ajet-reverse-text`` or ``ajet_reverse_text``), found on the verifiers interpreter's ``sys.path``.
"""

from __future__ import annotations

from collections.abc import Iterator

import verifiers.v1 as vf

from .scoring import SYSTEM_PROMPT, WORDS, score


class ReverseTextData(vf.TaskData):
    text: str


class ReverseTextTask(vf.Task[ReverseTextData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def similarity(self, trace: vf.Trace) -> float:
        return score(trace.last_reply, self.data.text)


class ReverseTextTaskset(vf.Taskset[ReverseTextTask, vf.TasksetConfig]):
    def load(self) -> Iterator[ReverseTextTask]:
        for word in WORDS:
            data = ReverseTextData(id=f"reverse-{word}", name=word, prompt=word, system_prompt=SYSTEM_PROMPT,
                                   text=word)
            yield ReverseTextTask(data, self.config.task)


__all__ = ["ReverseTextData", "ReverseTextTask", "ReverseTextTaskset"]
