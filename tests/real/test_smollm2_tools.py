"""A real pretrained LM calls a text tool: the composed SmolLM2 hybrid runs one GRPO step of `count_price` (its
calculator tool) through its own chat template. SmolLM2's template has no tool support, so the tools are described
in the default format; the first turns are scripted calls (a 135M model rarely writes one), the turns after the
results are SmolLM2's own."""

from __future__ import annotations

from tests.grpo.tool_scripts import call_text, script_first_turns
from tests.real.marks import REAL
from vlm_grpo.grpo.run.logs import read_jsonl
from vlm_grpo.grpo.settings.sources import load_config
from vlm_grpo.api.trainers import GRPOTrainer
from tests.trained import trained

pytestmark = REAL

SMOLLM_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def test_one_grpo_step_with_a_text_tool(hybrid_dir, tmp_path):
    cfg = load_config(overrides=[
        "--model", f"hybrid:{hybrid_dir}", "--recipe", "count_price", "--data.recipe_options", "{image_size: 64}",
        "--batch-size", "1", "--num-generations", "2", "--max-new-tokens", "96", "--max-steps", "1",
        "--max-tool-calling-iterations", "1", "--lora.r", "8", "--logging.progress", "false",
        "--logging.save_merged", "false", "--output-dir", str(tmp_path),
    ])
    trainer = GRPOTrainer.from_settings(cfg)
    assert not trainer.sampler.chat_format.native  # SmolLM2's template renders no tool calls: the default format
    script_first_turns(trainer.adapter, lambda r: call_text("calculator", expression=f"{r + 3} * 4"))
    (metrics,) = trained(trainer)
    assert metrics["tools/call_frequency"] == 1.0 and metrics["tools/failed_calls"] == 0
    assert metrics["completion_length"] > 0 and metrics["loss"] == metrics["loss"]
    rows = read_jsonl(tmp_path / "completions.jsonl")
    assert [r["turns"][1] for r in rows] == [{"role": "tool", "name": "calculator", "content": str(4 * (k + 3))}
                                            for k in range(2)]
    assert all(r["turns"][-1]["role"] == "assistant" for r in rows)  # SmolLM2 answered after the result
    prompt = rows[0]["prompt"]
    assert "<tools>" in prompt and '"name": "calculator"' in prompt and SMOLLM_SYSTEM not in prompt
