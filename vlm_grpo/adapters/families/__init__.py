
"""One module per model family; each is discovered by the registry (no import list to keep)."""
