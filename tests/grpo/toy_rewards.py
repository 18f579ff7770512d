"""Toy rewards for loop tests: dense enough that a random tiny model gets a learning signal."""


def lowercase_share(completions, **_):
    """Fraction of a completion's characters that are lowercase ASCII letters."""
    return [sum("a" <= c <= "z" for c in text) / max(len(text), 1) for text in completions]


def fails_on_digits(completions, **_):
    """Raises on completions that contain a digit (a reward with a parsing bug)."""
    out = []
    for text in completions:
        if any(c.isdigit() for c in text):
            raise ValueError(f"cannot parse {text[:20]!r}")
        out.append(1.0)
    return out


STEPS: list[int] = []  # the trainer_state.global_step of each call to record_steps


def record_steps(completions, trainer_state, **_):
    """Scores 0; records the step the trainer says it is at (TRL's trainer_state argument)."""
    STEPS.append(trainer_state.global_step)
    return [0.0] * len(completions)



def lowercase_share_on_even_counts(completions, answer, **_):
    """lowercase_share for prompts whose answer (a count) is even; a constant for the others (their groups have no
    spread: what dynamic sampling drops)."""
    return [share if int(a) % 2 == 0 else 0.5 for share, a in zip(lowercase_share(completions), answer)]


def constant(completions, **_):
    """The same score for every completion: no group has spread."""
    return [0.5] * len(completions)
