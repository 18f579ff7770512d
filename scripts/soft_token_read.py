"""Can the composed model's LM read a soft token? Every projected image feature is replaced by the input embedding
of a word, and the LM is asked which word it was shown (docs/smollm2-learns-to-see.md, "What to try next"). A model
that copies the words reads its image tokens' positions as words; one that does not cannot be aligned through them.

    .venv/bin/python scripts/soft_token_read.py MODEL_DIR

MODEL_DIR is a LLaVA-style composed model (vlm-grpo compose, or a stage's final/).
"""

from __future__ import annotations

import sys

import torch
from PIL import Image

WORDS = ("apple", "river", "seven", "green", "table", "music", "house", "water")
QUESTION = "Which word is shown above? Reply with the word only."


def main(model_dir: str) -> None:
    from vlm_grpo.loader import load_model

    adapter = load_model(model_dir, device="cpu", decide_cache=False)
    model, tokenizer = adapter.model.float().eval(), adapter.processor.tokenizer
    projector = getattr(model.model, "multi_modal_projector", None)
    if projector is None:
        raise SystemExit(f"{model_dir}: no multi_modal_projector (a LLaVA-style model is needed)")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}]
    prompt = adapter.processor.apply_chat_template(messages, add_generation_prompt=True)
    batch = adapter.processor(text=[prompt], images=[Image.new("RGB", (64, 64), "white")], return_tensors="pt")
    copied = 0
    for word in WORDS:
        vector = model.get_input_embeddings().weight[tokenizer(" " + word, add_special_tokens=False)["input_ids"][0]]
        hook = projector.register_forward_hook(lambda module, args, out, v=vector.detach(): v.expand_as(out).clone())
        try:
            with torch.no_grad():
                out = model.generate(**batch, max_new_tokens=6, do_sample=False)
        finally:
            hook.remove()
        said = tokenizer.decode(out[0, batch["input_ids"].shape[1]:], skip_special_tokens=True)
        copied += word in said.lower()
        print(f"{word} -> {said!r}")
    print(f"copied {copied} of {len(WORDS)}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(sys.argv[1])
