"""Deterministic pictures and prompts shared by the adapter tests."""

from __future__ import annotations

from PIL import Image, ImageDraw


def picture(width: int, height: int, seed: int) -> Image.Image:
    """A distinct, deterministic picture of a given size."""
    img = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(img)
    colours = [(220, 30, 30), (30, 30, 220), (30, 160, 30), (200, 200, 0)]
    for k in range(3):
        x0 = (seed * 13 + k * 17) % max(width - 12, 1)
        y0 = (seed * 7 + k * 23) % max(height - 12, 1)
        draw.rectangle([x0, y0, x0 + 12, y0 + 12], fill=colours[(seed + k) % 4])
    return img


def user_turn(n_images: int, text: str) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image"}] * n_images + [{"type": "text", "text": text}]}]


def mixed_batch(adapter):
    """3 samples, different image sizes, 2 images in the middle sample where the family allows."""
    two = 2 if getattr(adapter, "supports_multi_image", True) else 1
    images = [
        [picture(56, 56, 1)],
        [picture(112, 56, 2), picture(56, 84, 3)][:two],
        [picture(84, 112, 4)],
    ]
    texts = ["How many red squares?", "Which picture is wider? Answer briefly.", "Count the blue squares."]
    conversations = [user_turn(len(imgs), t) for imgs, t in zip(images, texts)]
    return conversations, images


def same_size_batch(adapter):
    """3 samples whose images all have one size (prompts of different lengths), a text-only one where the family
    takes it beside image rows."""
    two = 2 if getattr(adapter, "supports_multi_image", True) else 1
    images = [[picture(56, 56, 5)], [picture(56, 56, 6), picture(56, 56, 7)][:two], [picture(56, 56, 8)]]
    texts = ["How many?", "Which picture has more red squares? Answer briefly.", "Count the blue squares."]
    if getattr(adapter, "text_rows", "mixed") == "mixed":
        images[2], texts[2] = [], "No picture here: say hello."
    return [user_turn(len(imgs), t) for imgs, t in zip(images, texts)], images
