"""`vlm-grpo experiment CONFIG`: run a multi-stage experiment (compose, align, SFT, GRPO, the arms, eval), resumably,
for one or more seeds; `--test` also answers the test splits (the final table, once); `--summary` writes the table over
the seeds that finished (vlm_grpo/experiment/)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser(
        "experiment", help="run a compose -> align -> SFT -> GRPO (+ controls) -> eval experiment from one config (resumable)",
        description="Runs the stages of the experiment in CONFIG (examples/smollm2_learns_to_see.yaml) for each "
        "--seed. A finished stage is skipped (refused, naming the change, when the config now gives it other settings "
        "than it ran with) and a stopped one resumes from its newest checkpoint, so the same command continues a run. "
        "compose and align run once (base_seed) and are shared by every seed, unless the config sets "
        "independent_seeds. The arms (controls, GRPO variants) run after grpo, each from the SFT model. A stage runs "
        "in one command at a time: another command reaching it is refused, naming the first.",
    )
    p.add_argument("config", help="the experiment's YAML file")
    p.add_argument("--seed", type=int, nargs="+", default=[0], help="seeds of the SFT, GRPO and eval stages (default 0)")
    p.add_argument("--stages", default=None,
                   help="comma-separated stages to run, in pipeline order: compose, align, sft, grpo, the config's arms "
                   "by name, eval (default: all; none: only --summary)")
    p.add_argument("--test", action="store_true",
                   help="eval also answers the test splits (eval.test_splits): the final table, once the design is "
                   "fixed on the validation splits; a report written earlier is never asked again")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="override a config value, e.g. --set grpo.max_steps=4 (repeatable; VALUE read as YAML)")
    p.add_argument("--summary", action="store_true",
                   help="after the stages (or alone, with --stages none): the table over every finished seed")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.experiment.plan import ExperimentError, read_experiment
    from vlm_grpo.experiment.preflight import check_experiment
    from vlm_grpo.experiment.run import run_experiment
    from vlm_grpo.experiment.table import summarize_experiment

    exp = read_experiment(args.config, args.overrides)
    if args.stages is None:
        stages = exp.stage_names()
    else:
        stages = () if args.stages == "none" else tuple(s.strip() for s in args.stages.split(",") if s.strip())
    unknown = [s for s in stages if s not in exp.stage_names()]
    if unknown:
        raise ExperimentError(f"--stages: unknown stage(s) {unknown}; the stages are {', '.join(exp.stage_names())} "
                              "(or none)")
    check_experiment(exp, stages, args.seed)
    for seed in args.seed:
        run_experiment(exp, seed, stages, say=lambda line, seed=seed: print(f"[seed {seed}] {line}", flush=True),
                       test=args.test)
    if args.summary:
        summarize_experiment(exp)
        print((exp.output_dir / "summary.md").read_text())
    return 0
