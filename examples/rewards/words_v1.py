"""Reward code for the 'words' task, version 1 (the showcase edits it while training runs).
Graded, so that a group of attempts rarely ties: the share of the word's letters written in capitals."""


def reward(word: str, text: str) -> float:
    caps = set(c for c in (text or "") if c.isupper())
    return sum(c.upper() in caps for c in word) / len(word)
