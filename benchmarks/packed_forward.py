"""The training forward + backward of one step's completions, padded rows against packed ones (perf.padding_free).

    OMP_NUM_THREADS=1 python benchmarks/packed_forward.py --model pretrained:shapes-tiny --prompts 16 \
        --generations 8 --max-tokens 24 --shortest 2

Times `group_scores` (the shared prompt, then the completion pass) and the backward of the completions' log-probs,
with each completion's length drawn uniformly from shortest..max-tokens, alternating padded and packed runs on the
same draws; prints the mean of each and the rows the packing removed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vlm_grpo.grpo.logprobs import packing  # noqa: E402
from vlm_grpo.grpo.logprobs.completions import ScoreOptions, group_scores  # noqa: E402
from vlm_grpo.loader import load_model  # noqa: E402


def _prompt(k: int) -> tuple[list[dict], list[Image.Image]]:
    question = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": f"How many squares? ({k})"}]}]
    return question, [Image.new("RGB", (64, 64), (40 * k % 256, 90, 160))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="pretrained:shapes-tiny")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--generations", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=24)
    p.add_argument("--shortest", type=int, default=2)
    p.add_argument("--trials", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    adapter = load_model(args.model, dtype=torch.float32, device=torch.device("cpu"), decide_cache=False)
    questions, images = zip(*(_prompt(k) for k in range(args.prompts)))
    prompts = adapter.encode_prompts(list(questions), list(images))
    rows, width = args.prompts * args.generations, args.max_tokens
    index = [r // args.generations for r in range(rows)]
    ids = torch.randint(10, 100, (rows, width), generator=torch.Generator().manual_seed(0))

    def run(mode: str, lengths: torch.Tensor) -> float:
        mask = (torch.arange(width) < lengths[:, None]).long()
        adapter.model.zero_grad(set_to_none=True)
        started = time.perf_counter()
        scores = group_scores(adapter, prompts, index, ids, mask, options=ScoreOptions(share_prompt=True,
                                                                                       padding_free=mode))
        (scores.logps * mask).sum().backward()
        return time.perf_counter() - started

    times, saved = {"off": [], "on": []}, []
    for trial in range(args.trials + 1):
        lengths = torch.randint(args.shortest, width + 1, (rows,), generator=torch.Generator().manual_seed(trial))
        fed = packing.fed_lengths((torch.arange(width) < lengths[:, None]).long())
        saved.append(1 - len(packing.pack_rows(fed, index)) / rows)
        for mode in ("off", "on", "on", "off"):
            took = run(mode, lengths)
            if trial:  # the first draw warms up
                times[mode].append(took)
    padded, packed = (sum(times[m]) / len(times[m]) for m in ("off", "on"))
    print(f"{args.model}: {args.prompts} prompts x {args.generations}, lengths {args.shortest}..{width}, "
          f"{args.threads} thread(s); rows removed by packing {sum(saved[1:]) / args.trials:.0%}")
    print(f"padded {padded * 1000:.1f} ms, packed {packed * 1000:.1f} ms: {padded / packed:.2f}x")


if __name__ == "__main__":
    main()
