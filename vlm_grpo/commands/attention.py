"""`vlm-grpo attention`: where the model looks while it answers (inspect/attention.py)."""

from __future__ import annotations

from vlm_grpo.commands.model_args import add_model_args, load_from_args


def add_parser(sub) -> None:
    p = sub.add_parser("attention", help="heatmaps of each answer token's attention over the image")
    add_model_args(p)
    p.add_argument("--image", default=None, help="image file (default: a built-in test picture)")
    p.add_argument("--video", default=None, help="a video file, a folder of frame images, or 'probe' (a built-in clip): "
                   "heatmaps over each frame instead of an image (families that take video)")
    p.add_argument("--video-frames", type=int, default=8, help="frames sampled from a video file (default 8)")
    p.add_argument("--prompt", default="Describe the image.")
    p.add_argument("--layer", type=int, default=None, help="language-model layer (negative counts from the end; "
                   "default: mean over layers)")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--max-panels", type=int, default=24, help="panels in the grid (the mean panel included)")
    p.add_argument("--out", default="attention.png", help="output PNG (default attention.png)")
    p.set_defaults(func=run)


def run(args) -> int:
    from PIL import Image

    from vlm_grpo.file_kinds import not_a_file

    from vlm_grpo.compat.probe_image import probe_images
    from vlm_grpo.inspect.attention import answer_attention, render_attention

    problem = args.image and not_a_file(args.image, "image file")  # before the model loads: a folder, a FIFO
    if problem:
        raise ValueError(f"--image: {problem}")
    adapter = load_from_args(args)
    if args.video:
        return _run_video(adapter, args)
    image = Image.open(args.image) if args.image else probe_images()[0]
    maps = answer_attention(adapter, image, args.prompt, max_new_tokens=args.max_new_tokens, layer=args.layer)
    out = render_attention(maps, args.out, max_panels=args.max_panels)
    print(f"answer: {maps.answer!r}")
    print(f"attention on the image: {maps.image_share.mean():.1%} of each answer token's attention on average")
    print(f"heatmaps ({maps.heatmaps.shape[1]}x{maps.heatmaps.shape[2]} image grid) written to {out}")
    return 0


def _run_video(adapter, args) -> int:
    from pathlib import Path

    from PIL import Image

    from vlm_grpo.compat.probe_image import probe_clips
    from vlm_grpo.inspect.video_attention import render_video_attention, video_attention
    from vlm_grpo.videos import Video, read_video_file

    source = Path(args.video)
    if args.video == "probe":
        video = probe_clips()[0]
    elif source.is_dir():
        video = Video([Image.open(p).convert("RGB") for p in sorted(source.iterdir()) if p.is_file()])
    else:
        video = read_video_file(source, frames=args.video_frames, max_frames=args.video_frames)
    maps = video_attention(adapter, video, args.prompt, max_new_tokens=args.max_new_tokens, layer=args.layer)
    out = render_video_attention(maps, args.out)
    print(f"answer: {maps.answer!r}")
    shares = ", ".join(f"{f[0]}: {s:.1%}" for f, s in zip(maps.unit_frames, maps.unit_share))
    print(f"attention per frame unit (first frame: share): {shares}")
    print(f"heatmaps over {len(maps.unit_frames)} frame units written to {out}")
    return 0
