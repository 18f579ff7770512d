"""`vlm-grpo generate`: answer one image + prompt (greedy)."""

from __future__ import annotations

from vlm_grpo.commands.model_args import add_model_args, load_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="answer one image + prompt")
    add_model_args(p)
    p.add_argument("--image", default=None, help="image file (default: a built-in test picture)")
    p.add_argument("--prompt", default="Describe the image.")
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.set_defaults(func=run)


def run(args) -> int:
    from PIL import Image

    from vlm_grpo.file_kinds import not_a_file

    from vlm_grpo.compat.probe_image import probe_images

    problem = args.image and not_a_file(args.image, "image file")  # before the model loads: a folder, a FIFO
    if problem:
        raise ValueError(f"--image: {problem}")
    adapter = load_from_args(args)
    image = Image.open(args.image) if args.image else probe_images()[0]
    conversation = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": args.prompt}]}]
    batch = adapter.encode_prompts([conversation], [[image]]).to(next(adapter.model.parameters()).device)
    out = adapter.generate(batch, max_new_tokens=args.max_new_tokens)
    completion = out.sequences[0, batch.input_ids.shape[1] :]
    print(adapter.tokenizer.decode(completion, skip_special_tokens=True))
    return 0
