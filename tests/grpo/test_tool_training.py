"""GRPO steps with tools: the zoom recipe (a crop tool returning images) and count_price (a text calculator) on the
tiny twins, TRL 1.16's tools and environments run unchanged through the Python API, and the CLI settings.

The twins are random, so their first turns are scripted tool calls (tests/grpo/tool_scripts.py); everything after
(running the tools, the tool turns, later turns, rewards, log-probs, the update) is the real step."""

from __future__ import annotations

import asyncio
import json

import pytest
from PIL import Image

from tests.grpo.tool_scripts import call_text, script_first_turns
from vlm_grpo.adapters.registry import image_families
from vlm_grpo.adapters.sharing import image_features
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from vlm_grpo.grpo.training.vision_counter import VisionCounter
from vlm_grpo.recipes.base import user_turn
from tests.trained import trained

B, G = 2, 2
SMALL = ["--batch-size", str(B), "--num-generations", str(G), "--logging.progress", "false",
         "--max-tool-calling-iterations", "2"]
OPTIONS = {"zoom": "{canvas: 256, digits: 2, digit_height: 12, view_size: 56, zoom_size: 56}",
           "count_price": "{image_size: 56}"}
FAST = {("qwen2_5_vl", "zoom"), ("idefics3", "zoom"), ("gemma3", "count_price")}
CASES = [pytest.param(f, r, marks=() if (f, r) in FAST else pytest.mark.tools_matrix)
         for f in sorted(image_families()) for r in ("zoom", "count_price")]


def _units(adapter, size: int) -> int:
    """What the vision counter counts for encoding one size x size image (tiles, for tiled families)."""
    with VisionCounter(adapter, [adapter.model]) as counter:
        image_features(adapter, adapter.encode_prompts([user_turn("x")], [[Image.new("RGB", (size, size), "white")]]))
    return counter.images


def _first_turns(recipe: str):
    if recipe == "zoom":  # rows 0-2 crop different regions, row 3 answers at once
        return lambda r: call_text("crop", x=16 * r, y=8 * r, width=64, height=64) if r % 4 != 3 else "It reads 42"
    return lambda r: call_text("calculator", expression=f"{r + 2} * 7")


@pytest.mark.parametrize("family, recipe", CASES)
def test_two_grpo_steps_with_tools(tmp_path, family, recipe):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--model", f"tiny:{family}", "--recipe", recipe,
                                 "--data.recipe_options", OPTIONS[recipe], "--max-steps", "2", "--max-new-tokens", "200",
                                 *SMALL])
    trainer = GRPOTrainer.from_settings(cfg)
    script_first_turns(trainer.adapter, _first_turns(recipe), lambda r: "The answer is 14.")
    history = trained(trainer)
    prompt_units, tool_units = _units(trainer.adapter, 56), _units(trainer.adapter, 56)
    for m in history:
        assert m["tools/call_frequency"] == (0.75 if recipe == "zoom" else 1.0) and m["tools/failed_calls"] == 0
        tool_images = round(m["tools/images"] * B * G)
        assert tool_images == (3 if recipe == "zoom" else 0)  # each completion's own crops
        # the prompts' images once per group (B, not B x G), each tool image once, nothing encoded again in the
        # log-prob forwards: one encoder call for the prompts, one per round that returned images
        assert m["perf/vision_calls"] == 1 + (tool_images > 0)
        assert m["perf/vision_images"] == B * prompt_units + tool_images * tool_units
        assert m["rewards/tool_use"] == 0.375 if recipe == "zoom" else m["rewards/tool_use"] == 0.5
        assert m["completion_length"] < 200 and m["loss"] == m["loss"]
    rows = read_jsonl(tmp_path / "completions.jsonl")
    assert len(rows) == 2 * B * G and all("turns" in r and r["turns"][0]["role"] == "assistant" for r in rows)
    if recipe == "zoom":
        called = [r for r in rows if len(r["turns"]) > 1]
        assert called and all(r["turns"][1]["content"][0] == {"type": "image", "size": [56, 56]} for r in called)
        assert all("<image 56x56>" in r["completion"] for r in called)  # the trajectory, image markers included
    else:
        assert all(r["turns"][1]["content"] in {str((k + 2) * 7) for k in range(B * G)} for r in rows)


# ---------------------------------------------------------------- TRL 1.16's contract, unchanged
async def lookup(word: str) -> str:
    """Look a word up in the glossary.

    Args:
        word: the word to look up
    """
    await asyncio.sleep(0)
    return {"box": "a container", "red": "a colour"}.get(word, "unknown")


class TallyEnv:
    """Written for TRL 1.16's GRPOTrainer.from_settings(environment_factory=...): reset per rollout, tools, get_reward."""

    def reset(self, **kwargs) -> str:
        self.total = 0
        return "Start from zero."

    def add(self, amount: int) -> str:
        """Add to the running total.

        Args:
            amount: how much to add
        """
        self.total += amount
        return f"total={self.total}"

    def get_reward(self) -> float:
        return float(self.total)


def mentions_total(completions, environments, **kwargs):
    """A TRL-style reward over the conversation: +1 when the final message states the environment's total."""
    return [1.0 if f"{env.total}" in completion[-1]["content"] else 0.0
            for completion, env in zip(completions, environments)]


def test_trl_tools_and_environment_run_unchanged(tmp_path):
    cfg = load_config(overrides=["--output-dir", str(tmp_path), "--model", "tiny:qwen2_5_vl", "--recipe", "shapes",
                                 "--data.recipe_options", "{image_size: 56}", "--max-steps", "1",
                                 "--reward", "tests/grpo/test_tool_training.py:mentions_total", "--max-new-tokens", "320",
                                 *SMALL])
    trainer = GRPOTrainer.from_settings(cfg, tools=[lookup], environment_factory=TallyEnv)
    calls = [call_text("add", amount=3) + call_text("add", amount=4), call_text("lookup", word="box"),
             call_text("add", amount=5), "no tools"]
    script_first_turns(trainer.adapter, lambda r: calls[r], lambda r: "The total is 7.")
    seen = {}
    original = trainer.scoring.rewards_of  # where a rollout's rewards are taken

    def rewards_of(samples, rows, sampled, step):
        seen["conversations"], seen["session"] = sampled.rollout.conversations, sampled.session
        seen["prompts"] = sampled.session.prompts
        return original(samples, rows, sampled, step)

    trainer.scoring.rewards_of = rewards_of
    (metrics,) = trained(trainer)
    assert [e.total for e in seen["session"].environments] == [7, 0, 5, 0]  # one instance per rollout
    assert metrics["rewards/TallyEnv"] == pytest.approx(3.0)  # get_reward, named after the class (TRL)
    assert metrics["rewards/mentions_total"] == 0.25  # only row 0's answer states its total (7)
    first = seen["conversations"][0]
    assert [m["content"] for m in first if m["role"] == "tool"] == ["total=3", "total=7"]
    assert seen["conversations"][1][1] == {"role": "tool", "name": "lookup", "content": "a container"}  # async tool
    assert seen["prompts"][0][-1]["content"][-1] == {"type": "text", "text": "Start from zero."}  # reset's return


def test_cli_tool_environment_and_timeout_settings(tmp_path):
    from vlm_grpo.grpo.settings.sources import settings_help
    from vlm_grpo.inspect.completions import format_rows, load_completions
    from vlm_grpo.inspect.plots import RunData, charts

    tools = tmp_path / "my_tools.py"
    tools.write_text('def shout(text: str) -> str:\n    """Shout.\n\n    Args:\n        text: what to shout\n    """\n'
                     '    return text.upper()\n\n\nclass Env:\n    def reset(self, **row):\n        pass\n\n'
                     '    def ping(self) -> str:\n        """Ping."""\n        return "pong"\n')
    out = tmp_path / "run"
    cfg = load_config(overrides=["--output-dir", str(out), "--model", "tiny:qwen2_5_vl", "--recipe", "count_price",
                                 "--data.recipe_options", "{image_size: 56}", "--max-steps", "1", "--tool",
                                 f"{tools}:shout", "--environment", f"{tools}:Env", "--tool-timeout", "5",
                                 "--max-new-tokens", "200", *SMALL])
    assert cfg.tools.tools == [f"{tools}:shout"] and cfg.tools.tool_timeout == 5.0
    trainer = GRPOTrainer.from_settings(cfg)
    assert sorted(t.__name__ for t in trainer.toolset.tools) == ["calculator", "shout"]  # the recipe's, and --tool
    script_first_turns(trainer.adapter, lambda r: call_text(["shout", "ping", "calculator", "shout"][r],
                                                            **[{"text": "hi"}, {}, {"expression": "2*3"}, {"x": 1}][r]),
                       lambda r: "done")
    trained(trainer)
    rows = load_completions(out)
    results = [r["turns"][1]["content"] for r in rows]
    assert results == ["HI", "pong", "6", json.dumps({"error": "shout() got an unexpected keyword argument 'x'"})]
    view = format_rows(rows, width=120)
    assert "tools: 1 call, 0 images, 2 model turns" in view and "tools: 1 call (1 failed)" in view
    assert {"tool_use", "tool_failures"} <= {c.name for c in charts(RunData.load(out))}
    assert "--tool SPEC adds one entry to tools.tools" in settings_help() and "--tools.tool_timeout" in settings_help()
