"""Two distinct real pictures for the cache probe (the probe image and its control), and two clips made of them."""

from __future__ import annotations

from PIL import Image, ImageDraw


def probe_images(size: int = 112) -> tuple[Image.Image, Image.Image]:
    """A red triangle and blue circle on white, and a control with different shapes and colours."""
    first = Image.new("RGB", (size, size), "white")
    draw = ImageDraw.Draw(first)
    draw.polygon([(size * 0.1, size * 0.9), (size * 0.45, size * 0.2), (size * 0.8, size * 0.9)], fill="red")
    draw.ellipse([size * 0.55, size * 0.05, size * 0.95, size * 0.45], fill="blue")

    control = Image.new("RGB", (size, size), "black")
    draw = ImageDraw.Draw(control)
    draw.rectangle([size * 0.05, size * 0.05, size * 0.5, size * 0.6], fill="green")
    draw.rectangle([size * 0.55, size * 0.4, size * 0.95, size * 0.95], fill="yellow")
    return first, control


def probe_clips(frames: int = 4, size: int = 56):
    """Two clips for the video probe: the probe picture sliding right, and the control picture sliding down."""
    from vlm_grpo.videos import Video

    first, control = probe_images(size)
    step = max(1, size // (2 * frames))

    def slide(img: Image.Image, dx: int, dy: int) -> list[Image.Image]:
        out = []
        for t in range(frames):
            frame = Image.new("RGB", img.size, img.getpixel((0, 0)))
            frame.paste(img, (dx * step * t, dy * step * t))
            out.append(frame)
        return out

    return Video(slide(first, 1, 0), fps=2.0), Video(slide(control, 0, 1), fps=2.0)
