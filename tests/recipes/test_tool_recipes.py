"""The tool recipes without a model: zoom's canvas, view and crop tool; count_price's calculator; their rewards
over conversations as TRL hands them to rewards."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.count_price import calculator
from vlm_grpo.recipes.tool_rewards import tool_use
from vlm_grpo.recipes.zoom import ZoomEnvironment


def _ink(img: Image.Image) -> np.ndarray:
    return np.asarray(img.convert("L")) < 60  # the digits are black; the clutter is light grey


def test_zoom_digits_are_unreadable_small_and_readable_cropped():
    recipe = get_recipe("zoom")
    data = recipe.build(size=4, seed=3)
    sample = data[1]
    assert sample.fields == recipe.build(size=4, seed=3)[1].fields  # reproducible from (seed, index)
    canvas, view = sample.fields["canvas"], sample.images[0]
    assert canvas.size == (512, 512) and view.size == (64, 64) and len(sample.fields["answer"]) == 3
    assert _ink(canvas).sum() > 50 and _ink(view).sum() == 0  # at 64 px no stroke stays dark
    env = ZoomEnvironment()
    assert env.reset(**sample.fields) is None
    ys, xs = np.nonzero(_ink(canvas))
    zoomed = env.crop(int(xs.min()) - 4, int(ys.min()) - 4, 40, 40)
    assert max(zoomed.size) == 128 and _ink(zoomed).sum() > 100  # a digit, enlarged
    with pytest.raises(ValueError, match="inside the 512x512 image"):
        env.crop(500, 0, 40, 40)


def test_calculator_evaluates_arithmetic_only():
    assert calculator("7 * (3 + 2)") == "35" and calculator("10 / 4") == "2.5" and calculator("-3+1") == "-2"
    for bad in ("__import__('os')", "2 ** 99999", "x + 1"):
        with pytest.raises(ValueError, match="only numbers"):
            calculator(bad)


def test_rewards_read_the_conversation():
    call = {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator",
                                                                                                 "arguments": {}}}]}
    good = [call, {"role": "tool", "name": "calculator", "content": "35"}, {"role": "assistant", "content": "It is 35."}]
    failed = [call, {"role": "tool", "name": "calculator", "content": '{"error": "boom"}'},
              {"role": "assistant", "content": "35"}]
    unread = [{"role": "assistant", "content": "<tool_call>{oops"}]
    plain = [{"role": "assistant", "content": "35"}]
    recipe = get_recipe("count_price")
    answer = next(r.fn for r in recipe.rewards if r.name == "answer")
    assert answer([good, failed, unread, plain], answer=["35"] * 4) == [1.0, 1.0, 0.0, 1.0]
    assert tool_use([good, failed, unread, plain]) == [0.5, 0.0, 0.0, 0.0]
    assert recipe.tools == [calculator] and get_recipe("zoom").environment is ZoomEnvironment
