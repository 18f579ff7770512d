"""Broken rewards the audit must flag, each by its own behaviour (tests/reliability/test_broken_rewards.py)."""

import re


def _last_word(text):
    words = text.split()
    return words[-1] if words else ""


def last_word_in(completions, answer, **_):  # "" is in every string: the empty answer passes
    return [float(_last_word(c) in str(a)) for c, a in zip(completions, answer)]


def starts_with(completions, answer, **_):  # the answer starts with the (empty) completion
    return [float(str(a).startswith(c.strip())) for c, a in zip(completions, answer)]


def empty_regex(completions, answer, **_):  # \d* matches the empty string: every completion passes
    return [float(re.search(r"\d*", c) is not None) for c in completions]


def in_reversed(completions, answer, **_):  # completion in answer, not answer in completion
    return [float(c.strip() in str(a)) for c, a in zip(completions, answer)]


def length(completions, **_):
    return [min(len(c) / 200, 1.0) for c in completions]


def constant(completions, **_):
    return [1.0] * len(completions)


def raises_on_empty(completions, answer, **_):
    return [float(c.split()[-1].strip(".") == str(a)) for c, a in zip(completions, answer)]


def ignores_answer(completions, answer, **_):
    return [float(len(str(a)) > 0) for a in answer]
