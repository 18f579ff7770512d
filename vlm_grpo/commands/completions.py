"""`vlm-grpo completions RUN_DIR`: read completions with their reward components (inspect/completions.py)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("completions", help="read a run's completions with their reward components (spot reward hacking)")
    p.add_argument("run_dir", help="training run directory (holds completions.jsonl)")
    p.add_argument("--step", type=int, default=None, help="only this step (-1: the last logged step)")
    order = p.add_mutually_exclusive_group()
    order.add_argument("--best", action="store_true", help="highest first")
    order.add_argument("--worst", action="store_true", help="lowest first")
    p.add_argument("--by", default="reward", help="sort key: reward (default), advantage or a reward component")
    p.add_argument("--limit", type=int, default=10, help="how many to show (0: all; default 10)")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal's)")
    p.add_argument("--max-lines", type=int, default=6, help="lines of text per completion before cutting")
    p.add_argument("--prompt", action="store_true", help="also show each prompt")
    p.add_argument("--flagged", action="store_true", help="only completions a hacking guard flagged during training")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.inspect.completions import format_rows, load_completions, select, summary

    rows = load_completions(args.run_dir)
    order = "best" if args.best else "worst" if args.worst else "log"
    chosen = select(rows, step=args.step, order=order, limit=None, sort_key=args.by, flagged=args.flagged)
    head = f"{summary(chosen)} (of {len(rows)} logged)"
    print(head if order == "log" else f"{head}; {order} first by {args.by}")
    shown = chosen[: args.limit] if args.limit else chosen
    if shown:
        print(format_rows(shown, width=args.width, max_lines=args.max_lines, show_prompt=args.prompt))
    return 0
