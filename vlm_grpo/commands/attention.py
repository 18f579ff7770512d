"""`vlm-grpo attention`: where the model looks while it answers (inspect/attention.py)."""

from __future__ import annotations

from vlm_grpo.commands.model_args import add_model_args, load_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("attention", help="heatmaps of each answer token's attention over the image")
    add_model_args(p)
    p.add_argument("--image", default=None, help="image file (default: a built-in test picture)")
    p.add_argument("--prompt", default="Describe the image.")
    p.add_argument("--layer", type=int, default=None, help="language-model layer (negative counts from the end; "
                   "default: mean over layers)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-panels", type=int, default=24, help="panels in the grid (the mean panel included)")
    p.add_argument("--out", default="attention.png", help="output PNG (default attention.png)")
    p.set_defaults(func=run)


def run(args) -> int:
    from PIL import Image

    from vlm_grpo.compat.probe_image import probe_images
    from vlm_grpo.inspect.attention import answer_attention, render_attention

    adapter = load_from_args(args)
    image = Image.open(args.image) if args.image else probe_images()[0]
    maps = answer_attention(adapter, image, args.prompt, max_new_tokens=args.max_new_tokens, layer=args.layer)
    out = render_attention(maps, args.out, max_panels=args.max_panels)
    print(f"answer: {maps.answer!r}")
    print(f"attention on the image: {maps.image_share.mean():.1%} of each answer token's attention on average")
    print(f"heatmaps ({maps.heatmaps.shape[1]}x{maps.heatmaps.shape[2]} image grid) written to {out}")
    return 0
