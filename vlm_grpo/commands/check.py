"""`vlm-grpo check`: pre-flight checks on the real model and the recipe's data before a long job."""

from __future__ import annotations

from vlm_grpo.commands.settings import add_settings_command


def add_parser(sub) -> None:
    p = add_settings_command(
        sub, "check", run,
        help="pre-flight: cache probe, batch = one by one, image tokens = features, sequence budget, suppressed ids",
        description="Runs on the model and recipe a run would use (same settings as train: --model, --recipe, "
        "--data.recipe_options, --max-new-tokens, --cache-policy ...) and exits non-zero if any check fails.",
    )
    p.add_argument("--samples", type=int, default=4, help="recipe samples checked (default 4)")


def run(args, extra: list[str]) -> int:
    from vlm_grpo.compat.cache_policy import resolve_use_cache
    from vlm_grpo.compat.cache_probe import probe_cache, probe_steps
    from vlm_grpo.grpo.training.policy import load_policy
    from vlm_grpo.grpo.data.recipe_source import build_split
    from vlm_grpo.grpo.training.preflight import Finding, check_batch_vs_single, cheap_checks, row_names
    from vlm_grpo.grpo.settings.sources import check_sources, load_recipe_config
    from vlm_grpo.recipes.checked import CheckedSource

    cfg, recipe = load_recipe_config(args.config, extra)
    check_sources(cfg)
    if args.samples < 1:
        raise ValueError(f"--samples must be >= 1, got {args.samples}")
    adapter = load_policy(cfg, decide_cache=False)
    # the samples a run would train on: read through the same row checks (--on-bad-sample skip leaves bad rows out)
    data = CheckedSource(build_split(recipe, cfg.data, "train", max(args.samples, cfg.data.train_size), cfg.seed),
                         cfg.data.on_bad_sample).for_adapter(adapter)
    samples = [data[i] for i in range(min(args.samples, len(data)))]
    steps = probe_steps(cfg.generation.max_new_tokens)

    report = probe_cache(adapter, steps=steps)
    use_cache = resolve_use_cache(adapter, cfg.model.cache_policy, report=report)
    print(report.table())
    findings = [Finding("cache probe", report.path_ok(use_cache),
                        f"policy {cfg.model.cache_policy}: generation uses {'the KV cache' if use_cache else 'no cache'}")]
    if any(s.videos for s in samples) and adapter.takes_video:  # the data has video: probe with a clip too
        video = probe_cache(adapter, steps=steps, media="video")
        print(video.table())
        findings.append(Finding("cache probe (video)", video.path_ok(use_cache),
                                f"generation with {'the KV cache' if use_cache else 'no cache'} on a video prompt"))
    cheap = cheap_checks(adapter, samples, cfg.generation.max_new_tokens, row_names(data, recipe.name, len(samples)))
    findings += cheap
    if cheap[0].ok:  # tokens = features: comparing batch with one-by-one means nothing before that holds
        findings.append(check_batch_vs_single(adapter, samples, min(8, steps), tolerance=max(1e-4, report.tolerance)))
    print("\n".join(f.line() for f in findings))
    failed = sum(not f.ok for f in findings)
    print(f"{len(findings) - failed} of {len(findings)} checks passed")
    return 1 if failed else 0
