"""The multi-turn tool loop on a tiny twin: what happens when tools misbehave, the token budget and the round limit,
and the model's own chat template when it has tool support (TRL's Qwen3-VL template, calls parsed with its response
template through transformers' parse_response)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.conftest import tiny_adapter
from tests.grpo.tool_scripts import CropEnvironment, call_text, scripted_rollout
from vlm_grpo.grpo.user_calls import UserCodeError
from vlm_grpo.grpo.tools.chat_format import ChatFormat


def fails(reason: str) -> str:
    """Raise an error on purpose.

    Args:
        reason: the message of the error
    """
    raise RuntimeError(reason)


RELEASE = threading.Event()


def stalls(seconds: int) -> str:
    """Wait, then answer.

    Args:
        seconds: how long to wait
    """
    RELEASE.wait()
    return "late"


def gives_bytes(n: int) -> bytes:
    """Return raw bytes.

    Args:
        n: how many
    """
    return b"\0" * n


def _messages(ro, row):
    return ro.conversations[row]


def test_errors_go_back_to_the_model_and_are_counted():
    adapter = tiny_adapter("qwen2_5_vl")
    script = [call_text("fails", reason="disk on fire"), call_text("nowhere", x=1),
              "<tool_call>{\"name\": \"crop\", \"arguments\": {\"x\": 1,</tool_call>", call_text("stalls", seconds=60)]
    try:
        _, _, _, ro = scripted_rollout(adapter, lambda r: script[r], lambda r: "done", tools=[fails, stalls],
                                       timeout=0.5)
    finally:
        RELEASE.set()
    raised, unknown, malformed, stalled = (_messages(ro, r) for r in range(4))
    assert raised[1] == {"role": "tool", "name": "fails", "content": '{"error": "disk on fire"}'}
    assert raised[2]["content"] == "done"  # the model saw the error and went on
    assert unknown[1]["content"] == '{"error": "Tool nowhere not found."}'
    assert len(malformed) == 1 and "tool_calls" not in malformed[0]  # unreadable: counted, and the completion ends
    assert stalled[1]["content"] == '{"error": "no result within 0.5 s"}'
    m = ro.tool_metrics
    assert m["call_frequency"] == 3 / 4 and m["failed_calls"] == 3 / 4 and m["failure_frequency"] == 1.0
    assert m["malformed_calls"] == 1 / 4 and m["timeouts"] == 1 / 4 and m["images"] == 0
    assert ro.completion_images is None  # text results only
    own = ro.tool_mask.bool()
    assert (~own & ro.completion_mask.bool())[[0, 1, 3]].any(1).all() and not (~own & ro.completion_mask.bool())[2].any()


def test_a_tool_returning_an_unsupported_type_is_a_named_error():
    adapter = tiny_adapter("qwen2_5_vl")
    with pytest.raises(UserCodeError, match=r"tool 'gives_bytes' \(.*test_tool_rollout.py:40\) returned a bytes"):
        scripted_rollout(adapter, lambda r: call_text("gives_bytes", n=3), tools=[gives_bytes])


def test_results_that_do_not_fit_the_budget_end_the_completion():
    adapter = tiny_adapter("qwen2_5_vl")
    call = call_text("crop", x=0, y=0, width=40, height=40)
    length = len(adapter.tokenizer(call)["input_ids"]) + 1
    _, _, _, ro = scripted_rollout(adapter, lambda r: call, lambda r: "ok", max_new_tokens=length + 8)
    assert all(len(c) == 1 and c[0]["tool_calls"] for c in ro.conversations)  # the result was dropped (TRL's rule)
    assert ro.completion_mask.sum(1).max() <= length + 8 and ro.tool_mask.bool().equal(ro.completion_mask.bool())
    assert ro.tool_metrics["call_frequency"] == 1.0 and ro.tool_metrics["images"] == 0


def test_max_iterations_bounds_the_tool_rounds():
    adapter = tiny_adapter("qwen2_5_vl")
    call = call_text("crop", x=0, y=0, width=40, height=40)
    _, _, _, ro = scripted_rollout(adapter, lambda r: call, lambda r: call, max_iterations=2, max_new_tokens=400)
    for messages in ro.conversations:  # call, image, call, image, call (not run: the limit)
        assert [m["role"] for m in messages] == ["assistant", "tool", "assistant", "tool", "assistant"]
        assert messages[-1]["tool_calls"]
    assert ro.tool_metrics["call_frequency"] == 2.0 and ro.tool_metrics["images"] == 2.0
    assert ro.completion_images.rows == [[0, 4], [1, 5], [2, 6], [3, 7]]  # each completion its own images, in order


def test_the_models_own_tool_template_and_response_template():
    from trl.chat_template_utils import add_response_schema, qwen3_vl_chat_template

    adapter = tiny_adapter("qwen3_vl")
    saved = adapter.processor.chat_template
    adapter.processor.chat_template = adapter.tokenizer.chat_template = qwen3_vl_chat_template
    add_response_schema(adapter.processor)  # TRL's response template for Qwen3 (transformers' parse_response)
    try:
        fmt = ChatFormat(adapter)
        assert fmt.native and fmt.parses_with_prefix
        call = '<tool_call>\n{"name": "crop", "arguments": {"x": "4", "y": 0, "width": 30, "height": 30}}\n</tool_call>'
        session, _, prompts, ro = scripted_rollout(adapter, lambda r: call, lambda r: "It is red.")
    finally:
        adapter.processor.chat_template = adapter.tokenizer.chat_template = saved
        del adapter.tokenizer.response_template
    prompt = adapter.tokenizer.decode(prompts.input_ids[0])
    assert "<tools>" in prompt and '"name": "crop"' in prompt and session.template_tools[0]  # the template's tools
    completion = adapter.tokenizer.decode(ro.completion_ids[0][ro.completion_mask[0].bool()])
    assert "<|im_start|>user\n<tool_response>\n<|vision_start|><|image_pad|>" in completion  # its own tool turn
    first = ro.conversations[0][0]["tool_calls"][0]["function"]
    assert first == {"name": "crop", "arguments": {"x": 4, "y": 0, "width": 30, "height": 30}}  # typed by the schema
    assert ro.tool_metrics["images"] == 1.0 and ro.conversations[0][-1]["content"] == "It is red."


def test_environment_observations_and_a_dict_of_environments():
    from vlm_grpo.recipes.base import Sample, user_turn
    from tests.grpo.tool_scripts import picture

    class Greeter(CropEnvironment):
        def reset(self, images, target, **kwargs):
            super().reset(images)
            return f"Look for the {target}."

    class Counter:
        def reset(self, **kwargs):
            self.n = 0

        def bump(self, by: int) -> int:
            """Add to the counter.

            Args:
                by: the amount
            """
            self.n += by
            return self.n

    samples = [Sample(user_turn("Go."), [picture(0)], {"environment": "crop", "target": "box"}),
               Sample(user_turn("Go."), [picture(1)], {"environment": "count", "target": "x"})]
    adapter = tiny_adapter("qwen2_5_vl")
    script = lambda r: call_text("crop", x=0, y=0, width=30, height=30) if r < 2 else call_text("bump", by=r)
    session, _, prompts, ro = scripted_rollout(adapter, script, lambda r: "ok", samples=samples,
                                               environment={"crop": Greeter, "count": Counter})
    assert session.prompts[0][-1]["content"][-1] == {"type": "text", "text": "Look for the box."}
    assert "Look for the box." in adapter.tokenizer.decode(prompts.input_ids[0])
    names = [[t.__name__ for t in tools] for tools in session.tools]
    assert names == [["crop"], ["crop"], ["bump"], ["bump"]]  # each sample's environment, its own tools
    assert [e.n for e in session.environments[2:]] == [2, 3]  # one instance per rollout
    assert ro.conversations[3][1]["content"] == "3" and ro.tool_metrics["images"] == 0.5
    assert not np.isin(["crop"], [m.get("name") for m in ro.conversations[2]]).any()
