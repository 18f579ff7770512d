"""Version- and model-specific workarounds, each with the probe that proves it is needed."""
