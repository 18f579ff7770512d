"""Greedy evaluation of a policy on a recipe split: reward components, accuracy, and accuracy by
reasoning length (the shape-counting chapter's check: accuracy against response length should be an
inverted U; too short is guessing, too long is overthinking or hallucinating).

Completion length is counted as the training metric counts it: tokens up to and including the first
EOS (all `max_new_tokens` when the model never stops; such samples are flagged `truncated`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Sequence

import torch

from vlm_grpo.grpo.data.recipe_source import heldout_build
from vlm_grpo.grpo.rewards.inputs import RewardInputs, trainer_state
from vlm_grpo.grpo.rewards.weighted import run_rewards, score
from vlm_grpo.grpo.eval_stats import accuracy_stats
from vlm_grpo.grpo.rollout.generation import mask_after_eos
from vlm_grpo.grpo.guards.image_reliance import blanked


def quartile_edges(lengths: Sequence[int], buckets: int = 4) -> list[int]:
    """Inner edges splitting `lengths` into about `buckets` equal-count groups (ties merge groups)."""
    ordered = sorted(lengths)
    if not ordered:
        return []
    edges = []
    for k in range(1, buckets):
        edge = ordered[min(len(ordered) - 1, math.ceil(k * len(ordered) / buckets))]
        if edge > ordered[0] and edge not in edges:
            edges.append(edge)
    return edges


def length_buckets(lengths: Sequence[int], correct: Sequence[bool] | None, edges: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """Count and accuracy per length bucket [lo, hi); the first starts at 0, the last is open.

    `edges` are inner edges (ascending); none: quartiles of `lengths`. Every sample lands in one bucket.
    """
    inner = sorted(set(int(e) for e in edges)) if edges else quartile_edges(lengths)
    bounds = [0, *[e for e in inner if e > 0], None]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        rows = [i for i, n in enumerate(lengths) if n >= lo and (hi is None or n < hi)]
        hits = None if correct is None else sum(bool(correct[i]) for i in rows)
        out.append(
            {
                "bucket": f"[{lo}, {hi})" if hi is not None else f"[{lo}, inf)",
                "low": lo,
                "high": hi,
                "count": len(rows),
                "accuracy": None if hits is None or not rows else hits / len(rows),
                "mean_length": sum(lengths[i] for i in rows) / len(rows) if rows else None,
            }
        )
    return out


def inverted_u(buckets: list[dict[str, Any]]) -> bool | None:
    """Whether accuracy peaks in an inner bucket, above both the shortest and the longest (None: < 3 buckets)."""
    filled = [b["accuracy"] for b in buckets if b["count"] and b["accuracy"] is not None]
    if len(filled) < 3:
        return None
    peak = max(range(len(filled)), key=lambda i: filled[i])
    return 0 < peak < len(filled) - 1 and filled[peak] > filled[0] and filled[peak] > filled[-1]


def evaluate(
    adapter,
    recipe,
    split: str = "test",
    size: int = 64,
    seed: int = 0,
    batch_size: int = 8,
    max_new_tokens: int = 64,
    recipe_options: dict[str, Any] | None = None,
    rewards=None,
    length_edges: Sequence[int] | None = None,
    global_step: int = 0,
    max_steps: int = 0,
    dataset=None,
    image_reliance: bool = False,
) -> dict[str, Any]:
    """Greedy completions for `size` samples of `split`; every reward component's mean (over the completions it
    applies to), accuracy (share of samples whose `recipe.accuracy_reward` component is > 0), mean completion
    length, accuracy by length bucket, and one record per sample. `rewards` replaces the recipe's (list of
    `Reward`); rewards read `global_step` and `max_steps` off their `trainer_state`, as in training. `dataset`:
    the split already built (by `recipe.build` with these split, size, seed and options). `image_reliance`: answer
    the samples again with every image blanked, and report the accuracy without the images beside it."""
    if size < 1 or batch_size < 1:
        raise ValueError(f"eval size and batch size must be >= 1, got {size} and {batch_size}")
    rewards = list(recipe.rewards) if rewards is None else list(rewards)
    accuracy_key = recipe.accuracy_reward
    if accuracy_key is not None and accuracy_key not in {r.name for r in rewards}:
        accuracy_key = None
    if dataset is None:
        dataset = recipe.build(split=split, size=size, seed=seed, **(recipe_options or {}))
    model = adapter.model
    was_training = model.training
    model.eval()
    try:
        records = _answer(adapter, dataset, batch_size, max_new_tokens, rewards, accuracy_key, global_step, max_steps)
        blank = None
        if image_reliance:  # the same samples with every image blanked: what the answers owe to the image
            blank = _answer(adapter, BlankedImages(dataset), batch_size, max_new_tokens, rewards, accuracy_key,
                            global_step, max_steps)
    finally:
        model.train(was_training)
    if blank is not None and accuracy_key is not None:
        for record, without in zip(records, blank):  # each question's answer without its image, for paired statistics
            record["blank_correct"] = bool(without["correct"])
    report = summarize(records, [r.name for r in rewards], accuracy_key, split=split, length_edges=length_edges)
    if blank is not None and report["accuracy"] is not None:
        report["image_reliance"] = reliance_summary(records, blank)
    return report


class BlankedImages:
    """A split whose samples have each image replaced by its mean colour (image_reliance.blank_image): the prompt's
    tokens stay the same, the picture's content is gone."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int):
        return blanked([self.dataset[index]])[0]


def reliance_summary(records: list[dict[str, Any]], blank: list[dict[str, Any]]) -> dict[str, Any]:
    """Accuracy with the images and with them blanked, and how many answers the blanking changed."""
    with_image = sum(bool(r["correct"]) for r in records) / len(records)
    without = sum(bool(r["correct"]) for r in blank) / len(blank)
    changed = sum(a["completion"] != b["completion"] for a, b in zip(records, blank)) / len(records)
    return {"blank_accuracy": without, "accuracy_drop": with_image - without, "answers_changed": changed}


def _answer(adapter, dataset, batch_size, max_new_tokens, rewards, accuracy_key, global_step, max_steps):
    """One greedy completion per sample of `dataset`, scored: a record per sample."""
    param = next(adapter.model.parameters())
    records: list[dict[str, Any]] = []
    for start in range(0, len(dataset), batch_size):
        indices = list(range(start, min(start + batch_size, len(dataset))))
        samples = [dataset[i] for i in indices]
        batch = adapter.encode_prompts([s.prompt for s in samples], [s.images for s in samples],
                                       [s.videos for s in samples])
        batch = batch.to(param.device, dtype=param.dtype)
        out = adapter.generate(batch, max_new_tokens=max_new_tokens, do_sample=False)
        ids = out.sequences[:, batch.input_ids.shape[1]:]
        mask = mask_after_eos(ids, adapter.eos_token_ids)
        texts = adapter.tokenizer.batch_decode(ids * mask + adapter.pad_token_id * (1 - mask), skip_special_tokens=True)
        stopped = (torch.isin(ids, torch.tensor(adapter.eos_token_ids, device=ids.device)) & mask.bool()).any(1)
        inputs = RewardInputs.from_samples(samples, 1, texts, ids, mask, trainer_state(global_step, max_steps))
        total, components = score(rewards, inputs)
        for row, index in enumerate(indices):
            parts = {name: v[row].item() for name, v in components.items()}
            records.append(
                {
                    "index": index,
                    "prompt": prompt_text(samples[row].prompt),
                    "completion": texts[row],
                    "length": int(mask[row].sum().item()),
                    "truncated": not bool(stopped[row].item()),
                    "reward": total[row].item(),
                    "rewards": parts,
                    "correct": None if accuracy_key is None else parts[accuracy_key] > 0,
                    **({"question_type": str(samples[row].fields["question_type"])}
                       if samples[row].fields.get("question_type") is not None else {}),
                    # the right answer, where the sample names one: constant-answer baselines are counted from it
                    **({"answer": str(samples[row].fields["answer"])}
                       if isinstance(samples[row].fields.get("answer"), (str, int, float)) else {}),
                }
            )
    return records


def prompt_text(conversation: Sequence[dict[str, Any]]) -> str:
    """The text of a conversation's last user turn (image parts left out)."""
    content = conversation[-1]["content"]
    if isinstance(content, str):
        return content
    return " ".join(part["text"] for part in content if part.get("type") == "text")


def side_by_side(before: dict[str, Any], after: dict[str, Any], limit: int | None = None) -> str:
    """The same held-out samples answered before and after training (two `evaluate` reports), in sample order."""
    after_by_index = {r["index"]: r for r in after["samples"]}
    lines = []
    for record in before["samples"][:limit]:
        later = after_by_index.get(record["index"])
        if later is None:
            continue

        def mark(r):
            return "" if r.get("correct") is None else (" [right]" if r["correct"] else " [wrong]")

        lines += [f"#{record['index']} {record.get('prompt', '')}",
                  f"  before{mark(record)}: {record['completion']}",
                  f"  after{mark(later)}:  {later['completion']}", ""]
    return "\n".join(lines).rstrip()


def heldout_seed(cfg) -> int:
    """The seed that draws the held-out questions: eval.data_seed, else the run's seed."""
    return cfg.seed if cfg.eval.data_seed is None else cfg.eval.data_seed


def heldout_split(recipe, cfg):
    """The samples a run's held-out evaluation answers (eval section: split, size, data seed; the data settings)."""
    return heldout_build(recipe, cfg.data, cfg.eval.split, cfg.eval.size, heldout_seed(cfg))


def run_rewards_of(recipe, cfg, device=None, required: bool = True):
    """A run's rewards, loaded: data.rewards (or the recipe's), then data.reward_models on `device`; `required=False`
    (SFT, whose rewards only score held-out evaluations): none is fine."""
    options = {"judge_question": cfg.data.judge_question, "device": device, "seed": cfg.seed,
               "trust_remote_code": cfg.model.trust_remote_code, "allow_pickle_weights": cfg.model.allow_pickle_weights}
    return run_rewards(recipe, cfg.data.rewards, cfg.data.reward_weights, cfg.data.reward_models, options, required)


def evaluate_run(adapter, recipe, cfg, rewards=None, step: int = 0, dataset=None) -> dict[str, Any]:
    """`evaluate` with a run config's settings: the eval section (split, size, batch size, data seed),
    generation.max_new_tokens, the data settings, and the run's rewards (`rewards`, already loaded, or else
    `run_rewards` of data.rewards and data.reward_weights); `step` is the run's step; `dataset`: the
    `heldout_split` already built (a run evaluating more than once builds, or streams, it once)."""
    return evaluate(
        adapter,
        recipe,
        split=cfg.eval.split,
        size=cfg.eval.size,
        batch_size=cfg.eval.eval_batch_size,
        max_new_tokens=cfg.generation.max_new_tokens,
        rewards=run_rewards_of(recipe, cfg, next(adapter.model.parameters()).device) if rewards is None else rewards,
        length_edges=cfg.eval.length_edges or None,
        global_step=step,
        max_steps=cfg.max_steps,
        dataset=heldout_split(recipe, cfg) if dataset is None else dataset,
        image_reliance=cfg.eval.image_reliance,
    )


def heldout_metrics(report: dict[str, Any]) -> dict[str, float]:
    """A report's headline numbers as metrics.jsonl keys (eval/accuracy, eval/reward, eval/completion_length)."""
    out = {"eval/completion_length": report["completion_length"]}
    if report["reward"] is not None:  # None: no reward applied to any sample
        out["eval/reward"] = report["reward"]
    if report["accuracy"] is not None:
        out["eval/accuracy"] = report["accuracy"]
    return out


def _present_mean(values: Sequence[float]) -> float | None:
    """Mean over the values that are not NaN (a reward that returned None does not apply); None if none is."""
    present = [v for v in values if not math.isnan(v)]
    return sum(present) / len(present) if present else None


def summarize(records: list[dict[str, Any]], reward_names: list[str], accuracy_key: str | None, split: str = "",
              length_edges: Sequence[int] | None = None) -> dict[str, Any]:
    n = len(records)
    lengths = [r["length"] for r in records]
    correct = None if accuracy_key is None else [bool(r["correct"]) for r in records]
    buckets = length_buckets(lengths, correct, length_edges)
    return {
        "split": split,
        "size": n,
        "reward": _present_mean([r["reward"] for r in records]),
        "rewards": {name: _present_mean([r["rewards"][name] for r in records]) for name in reward_names},
        "accuracy_reward": accuracy_key,
        **({"accuracy": None} if correct is None or not n else accuracy_stats(correct)),
        "completion_length": sum(lengths) / n,
        "truncated": sum(r["truncated"] for r in records) / n,
        "length_buckets": buckets,
        "inverted_u": inverted_u(buckets),
        "by_question_type": by_question_type(records) if correct is not None else {},
        "samples": records,
    }


def by_question_type(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Accuracy of each kind of question, where the recipe names it (a sample's `question_type` field): one mean can
    hide a kind the model never answers."""
    by_kind: dict[str, list[bool]] = {}
    for r in records:
        if "question_type" in r:
            by_kind.setdefault(r["question_type"], []).append(bool(r["correct"]))
    return {kind: {"n": len(correct), **accuracy_stats(correct)} for kind, correct in sorted(by_kind.items())}


def format_report(report: dict[str, Any]) -> str:
    """A plain-text table: summary lines, then accuracy by completion-length bucket."""
    def num(v):
        return "-" if v is None else f"{v:.3f}"

    lines = [f"split {report['split']}: {report['size']} samples"]
    lines.append(f"  accuracy ({report['accuracy_reward'] or 'n/a'} > 0)  {num(report['accuracy'])}")
    if report.get("accuracy_se") is not None:
        low, high = report["accuracy_ci95"]
        lines.append(f"  accuracy standard error  {report['accuracy_se']:.3f}; 95% interval (Wilson) [{low:.3f}, {high:.3f}]")
    reliance = report.get("image_reliance")
    if reliance:
        lines.append(f"  image reliance: accuracy with the images blanked {reliance['blank_accuracy']:.3f} (drop "
                     f"{reliance['accuracy_drop']:+.3f}); {100 * reliance['answers_changed']:.0f}% of answers changed")
    for kind, stats in (report.get("by_question_type") or {}).items():
        lines.append(f"  accuracy on {kind} questions  {stats['accuracy']:.3f} +/- {stats['accuracy_se']:.3f} (n {stats['n']})")
    lines.append(f"  reward (weighted total)  {num(report['reward'])}")
    for name, value in report["rewards"].items():
        lines.append(f"  rewards/{name}  {num(value)}")
    lines.append(f"  completion length  {report['completion_length']:.1f} tokens ({100 * report['truncated']:.0f}% hit max_new_tokens)")
    rows = [("length (tokens)", "count", "accuracy")] + [
        (b["bucket"], str(b["count"]), num(b["accuracy"])) for b in report["length_buckets"]
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines.append("")
    for k, (a, b, c) in enumerate(rows):
        lines.append(f"  {a.ljust(widths[0])}  {b.rjust(widths[1])}  {c.rjust(widths[2])}")
        if k == 0:
            lines.append("  " + "  ".join("-" * w for w in widths))
    shape = {True: "yes", False: "no", None: "n/a (fewer than 3 filled buckets)"}[report["inverted_u"]]
    lines.append(f"  inverted U (accuracy peaks at a middle length): {shape}")
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    """The report as JSON at `path` (run/outputs.py: a file this program did not write there is moved aside, never
    overwritten; in a run directory the report is listed as the run's)."""
    from vlm_grpo.grpo.run.outputs import write_output

    path, note = write_output(path, json.dumps(report, indent=2, default=str))
    if note:
        print(note)
    return path
