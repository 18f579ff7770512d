"""`vlm-grpo check-cache`: does KV-cached generation see the same model as a full forward? (compat/)"""

from __future__ import annotations

import contextlib
import sys

from vlm_grpo.commands.model_args import add_model_args, load_from_args
from vlm_grpo.compat.names import FAULTS


def add_parser(sub) -> None:
    p = sub.add_parser("check-cache", help="probe whether KV-cached generation agrees with a full forward")
    add_model_args(p)
    p.add_argument("--steps", type=int, default=16, help="decode steps compared (>= 2)")
    p.add_argument("--simulate-quirk", nargs="?", const="drop_image", default=None, choices=FAULTS,
                   help="self-test: corrupt cached decoding one way (default drop_image; drop_video with --media video)")
    p.add_argument("--media", choices=("image", "video"), default="image",
                   help="what the probe prompt shows (video: families that take video)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.compat.cache_policy import resolve_use_cache
    from vlm_grpo.compat.cache_probe import probe_cache
    from vlm_grpo.compat.simulated_faults import InertFault, simulated_fault

    adapter = load_from_args(args, decide_cache=False)  # the probe below is the decision
    simulate = simulated_fault(adapter, args.simulate_quirk) if args.simulate_quirk else contextlib.nullcontext()
    try:
        with simulate:
            report = probe_cache(adapter, steps=args.steps, media=args.media)
            adapter.use_cache = resolve_use_cache(adapter, args.cache_policy, report=report)
    except InertFault as err:  # the self-test cannot test anything: an error, never a pass
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(report.table())
    chosen = "KV cache" if adapter.use_cache else "no cache"
    print(f"policy {args.cache_policy}: generation uses {chosen}")
    if not report.finite:
        print("FAIL: the model produces non-finite logits", file=sys.stderr)
        return 1
    if report.blind:
        print(f"FAIL: the probe is blind (swapping the {args.media} did not change the logits)", file=sys.stderr)
        return 2
    if not report.path_ok(adapter.use_cache):
        print(f"FAIL: the path the policy uses ({chosen}) disagrees with the teacher-forced forward", file=sys.stderr)
        return 1
    return 0
