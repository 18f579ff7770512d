"""Toy rewards for loop tests: dense enough that a random tiny model gets a learning signal."""


def lowercase_share(completions, **_):
    """Fraction of a completion's characters that are lowercase ASCII letters."""
    return [sum("a" <= c <= "z" for c in text) / max(len(text), 1) for text in completions]
