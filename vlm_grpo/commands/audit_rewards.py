"""`vlm-grpo audit-rewards`: the run's rewards score adversarial completions of real samples (grpo/rewards/audit.py)."""

from __future__ import annotations

import json
from pathlib import Path

from vlm_grpo.commands.settings import add_settings_command


def add_parser(sub) -> None:
    p = add_settings_command(
        sub, "audit-rewards", run,
        help="before a run: can the rewards be earned without solving the task? (exits 1 on an exploit)",
        description="Scores adversarial completions (empty, only the format, the question echoed, every allowed "
        "answer listed, the answer repeated, the right answer in the wrong form, the right form with a wrong answer, "
        "long padding, the reference answer) of samples drawn by the run's seed, with the run's rewards (--recipe, "
        "--dataset, --reward ... as for train) and flags a reward that pays an adversary as much as a right answer.",
    )
    p.add_argument("--samples", type=int, default=16, help="samples scored, drawn from the split by the run's seed "
                   "(default 16, at most 64)")
    p.add_argument("--allow", action="append", default=[], metavar="NAME",
                   help="accept findings of this reward, adversary or reward:adversary (repeatable; also "
                   "guard.audit_allow)")
    p.add_argument("--json", default=None, metavar="PATH", help="also write the report as JSON")


def run(args, extra: list[str]) -> int:
    from vlm_grpo.grpo.data.recipe_source import build_split
    from vlm_grpo.grpo.rewards.audit import audit_rewards, completion_tokens
    from vlm_grpo.grpo.rewards.audit_bounds import MAX_AUDIT_ROWS, audit_rows
    from vlm_grpo.grpo.rewards.weighted import run_rewards
    from vlm_grpo.grpo.run.outputs import write_output
    from vlm_grpo.grpo.settings.sources import check_sources, load_recipe_config
    from vlm_grpo.grpo.training.policy import load_policy
    from vlm_grpo.grpo.guards.hacking_watch import run_hints
    from vlm_grpo.recipes.checked import CheckedSource

    cfg, recipe = load_recipe_config(args.config, extra)
    check_sources(cfg)
    if not 1 <= args.samples <= MAX_AUDIT_ROWS:
        raise ValueError(f"--samples must be 1..{MAX_AUDIT_ROWS} (the audit's row bound), got {args.samples}")
    rewards = run_rewards(recipe, cfg.data.rewards, cfg.data.reward_weights)
    data = CheckedSource(build_split(recipe, cfg.data, "train", max(args.samples, cfg.data.train_size), cfg.seed),
                         cfg.data.on_bad_sample)
    samples = [data[i] for i in audit_rows(len(data), cfg.seed, args.samples)]
    # the model's tokenizer: rewards read completion token ids, and completions end at the run's length limit
    adapter = load_policy(cfg, decide_cache=False)
    limit = cfg.generation.max_new_tokens
    encode = completion_tokens(adapter.tokenizer, (adapter.eos_token_ids or [None])[0], limit)
    report = audit_rewards(rewards, samples, run_hints(recipe, custom_rewards=bool(cfg.data.rewards)), encode=encode,
                           padding_words=2 * limit, max_steps=cfg.max_steps, timeout=cfg.data.reward_timeout or None)
    allow = [*cfg.guard.audit_allow, *args.allow]
    print(report.table())
    print("\nexamples (the first sample):")
    for name, text in report.examples.items():
        print(f"  {name:<18} {' '.join(text.split())[:100]!r}")
    for note in report.notes:
        print(f"note: {note}")
    if report.errors:
        print(f"rewards that raised on adversarial completions (scored 0): {report.errors}")
    for line in report.accepted_lines(allow):
        print(f"accepted: {line}")
    flags = report.flags(allow)
    for finding in flags:
        print(f"FLAG: {finding.line()}")
    if args.json:
        _, note = write_output(Path(args.json), json.dumps(report.to_dict(allow), indent=1, default=float) + "\n")
        if note:
            print(note)
    print(f"{len(flags)} exploits flagged" + (" (--allow NAME accepts one)" if flags else ""))
    return 1 if flags else 0
