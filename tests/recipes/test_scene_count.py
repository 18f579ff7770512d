"""The scene_count recipe (the SmolLM2-learns-to-see task): splits are reproducible and distinct, every answer is
the number of shapes the question asks about, the OOD look differs from the training look, and the rewards are
clevr_count's (seed 004's)."""

from __future__ import annotations

import pytest
from PIL import ImageStat

from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.clevr_count import correctness, strict_format
from vlm_grpo.recipes.scene_count import COLOURS, KINDS, scene

RECIPE = get_recipe("scene_count")


def test_rewards_are_seed_004s():
    assert [(r.fn, r.weight) for r in RECIPE.rewards] == [(strict_format, 1.0), (correctness, 1.0)]
    assert RECIPE.accuracy_reward == "correctness"


def test_the_reference_answer_is_the_count_the_question_asks_for():
    data = RECIPE.build(split="train", size=60, seed=4)
    for i in range(len(data)):
        sample = data[i]
        question = sample.prompt[-1]["content"][-1]["text"]
        listed = sample.reference.split("<think>")[1].split("</think>")[0].split(", ")
        assert str(len(listed)) == sample.fields["answer"]
        for item in listed:
            colour, kind = item.split(" ")
            assert colour in COLOURS and kind in KINDS
            if question.startswith("How many shapes"):
                continue
            asked = question.split("How many ")[1].split(" ")[0]
            assert asked in (colour, kind + "s")
        # the reference earns both of seed 004's rewards
        assert strict_format([sample.reference]) == [0.5]
        assert correctness([sample.reference], [sample.fields["answer"]]) == [2.0]


def test_splits_are_reproducible_and_differ():
    a, b = RECIPE.build(split="test", size=5, seed=1), RECIPE.build(split="test", size=5, seed=1)
    assert [a[i].reference for i in range(5)] == [b[i].reference for i in range(5)]
    assert list(a[0].images[0].getdata()) == list(b[0].images[0].getdata())
    train = RECIPE.build(split="train", size=5, seed=1)
    assert [train[i].images[0].tobytes() for i in range(5)] != [a[i].images[0].tobytes() for i in range(5)]


def test_the_ood_look_differs_but_asks_the_same_questions():
    import random

    train, ood = RECIPE.build(split="train", size=40, seed=0), RECIPE.build(split="ood", size=40, seed=0)
    # training scenes: a white canvas; OOD: a tinted, speckled one
    def white(image):
        return sum(p == (255, 255, 255) for p in image.getdata()) / (image.width * image.height)

    assert all(white(train[i].images[0]) > 0.3 for i in range(40))
    assert all(white(ood[i].images[0]) == 0 and max(ImageStat.Stat(ood[i].images[0]).mean) < 230 for i in range(40))
    assert {ood[i].prompt[-1]["content"][-1]["text"] for i in range(40)} <= {
        t for t in (*(f"How many {c} shapes are in the image?" for c in COLOURS),
                    *(f"How many {k}s are in the image?" for k in KINDS), "How many shapes are in the image?")}
    # OOD shapes are smaller and off the grid
    sizes = [s.size for s in scene(random.Random(0), ood=True)]
    assert max(sizes) < min(s.size for s in scene(random.Random(0), ood=False))


def test_caption_task_lists_every_shape():
    sample = RECIPE.build(split="train", size=1, seed=2, task="caption")[0]
    counted = RECIPE.build(split="train", size=1, seed=2)[0]
    assert sample.reference == sample.fields["answer"] and "<think>" not in sample.reference
    assert counted.reference.split("<think>")[1].split("</think>")[0] in sample.reference or \
        set(counted.reference.split("<think>")[1].split("</think>")[0].split(", ")) <= set(sample.reference.split(", "))


@pytest.mark.parametrize("option,value,message", [("split", "val", "choose one of train, test, ood"),
                                                  ("task", "vqa", "choose one of count, caption"),
                                                  ("image_size", 8, "at least 16 pixels")])
def test_bad_options_are_refused_by_name(option, value, message):
    with pytest.raises(ValueError, match=message):
        RECIPE.build(**{option: value})
