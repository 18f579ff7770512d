"""`count_price`: count the shapes in a picture, then price them with a calculator tool (a text-only tool).

A canvas holds 2-9 circles of one colour among squares of another; the question gives a price per circle
("each red circle costs 7 coins") and asks for the total. The recipe's tool `calculator(expression)` evaluates
arithmetic (+ - * / and parentheses on numbers) and returns the value as text. Images and numbers come from
(seed, index).

Rewards: `answer` (+1: the last number of the final message is count x price) and `tool_use` (+0.5: at least one
call, all well formed, none failed).
"""

from __future__ import annotations

import ast
import operator
import random
from dataclasses import dataclass

from PIL import Image, ImageDraw

from vlm_grpo.recipes.base import Recipe, Reward, Sample, user_turn
from vlm_grpo.recipes.generated import GeneratedSamples
from vlm_grpo.recipes.tool_rewards import final_number_answer, tool_use

COLOURS = {"red": (210, 40, 40), "blue": (40, 60, 210), "green": (40, 160, 60)}
_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
              ast.USub: operator.neg, ast.UAdd: operator.pos}


def _evaluate(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.operand))
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression and return its value.

    Args:
        expression: numbers with + - * / and parentheses, e.g. "7 * (3 + 2)"
    """
    if len(expression) > 200:
        raise ValueError("the expression is too long (200 characters at most)")
    value = _evaluate(ast.parse(expression, mode="eval").body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


@dataclass
class CountPriceDataset(GeneratedSamples):
    stream = "count_price"
    image_size: int = 224
    counts: tuple[int, int] = (2, 9)

    def draw(self, index: int, rng: random.Random) -> Sample:
        colour, other = rng.sample(sorted(COLOURS), 2)
        count, price = rng.randint(*self.counts), rng.randint(3, 19)
        s = self.image_size
        img = Image.new("RGB", (s, s), "white")
        draw = ImageDraw.Draw(img)
        r = max(3, s // 24)
        cells = rng.sample([(i, j) for i in range(6) for j in range(6)], count + rng.randint(1, 4))
        for k, (i, j) in enumerate(cells):  # one shape per cell of a 6x6 grid: nothing overlaps
            cx, cy = (i + 0.5) * s / 6, (j + 0.5) * s / 6
            if k < count:
                draw.ellipse((cx - r, cy - r, cx + r, cy + r), fill=COLOURS[colour])
            else:
                draw.rectangle((cx - r, cy - r, cx + r, cy + r), fill=COLOURS[other])
        question = (f"Each {colour} circle costs {price} coins. How many coins do all the {colour} circles in the "
                    "picture cost together? Count them, use the calculator tool for the price, then answer with "
                    "the number.")
        return Sample(prompt=user_turn(question), images=[img],
                      fields={"answer": str(count * price), "count": count, "price": price, "colour": colour},
                      reference=f"There are {count} {colour} circles; {count} x {price} = {count * price}.")


answer = final_number_answer  # +1.0 when the last number of the final message is the total price


def build(split: str = "train", size: int = 256, seed: int = 0, image_size: int = 224,
          counts: tuple[int, int] = (2, 9)) -> CountPriceDataset:
    low, high = counts
    if not 1 <= low <= high <= 30:
        raise ValueError(f"count_price: counts must be 1 <= low <= high <= 30, got {counts}")
    return CountPriceDataset(size, seed, split, image_size, (int(low), int(high)))


RECIPE = Recipe(
    name="count_price",
    build=build,
    rewards=[Reward("answer", answer), Reward("tool_use", tool_use)],
    accuracy_reward="answer",
    tools=[calculator],
)
