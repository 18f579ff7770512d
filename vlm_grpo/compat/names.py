"""The names the command line offers for compat's choices, kept free of heavy imports: `vlm-grpo --help` lists
them without loading torch or transformers."""

POLICIES = ("auto", "cache", "no-cache")  # may generation use the KV cache (cache_policy.py)
# the simulated cached-decoding faults (simulated_faults.py); a video fault is caught by the probe with a video prompt
IMAGE_FAULTS = ("drop_image", "late_drop", "shift_positions", "reorder_image_cache", "mask_image_attention", "nan_weights")
VIDEO_FAULTS = ("drop_video",)
FAULTS = IMAGE_FAULTS + VIDEO_FAULTS
