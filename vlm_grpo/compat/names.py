"""The names the command line offers for compat's choices, kept free of heavy imports: `vlm-grpo --help` lists
them without loading torch or transformers."""

POLICIES = ("auto", "cache", "no-cache")  # may generation use the KV cache (cache_policy.py)
FAULTS = ("drop_image", "late_drop", "shift_positions", "reorder_image_cache", "mask_image_attention",
          "nan_weights")  # the simulated cached-decoding faults (simulated_faults.py)
