"""The scene_count recipe (the SmolLM2-learns-to-see task): splits are reproducible and distinct, every answer is
the number of shapes the question asks about, the OOD look differs from the training look, and the rewards are
clevr_count's (those of the blog post "Can an LLM Learn to See?")."""

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
    """Checked against the cell labels (what each grid cell holds), not against the reasoning text."""
    colours = list(COLOURS)
    data = RECIPE.build(split="train", size=80, seed=4)
    for i in range(len(data)):
        sample = data[i]
        question = sample.prompt[-1]["content"][-1]["text"]
        shapes = [(colours[(v - 1) // 3], KINDS[(v - 1) % 3]) for v in sample.fields["cells"] if v]
        if question == "How many shapes are in the image?":
            truth = len(shapes)
        else:
            asked = question.split("How many ")[1].split(" ")[0]
            truth = sum(asked in (colour, kind + "s") for colour, kind in shapes)
        assert sample.fields["answer"] == str(truth) and truth >= 1
        # the reasoning states the counts the answer is read from
        thinking = sample.reference.split("<think>")[1].split("</think>")[0]
        stated = dict(part.rsplit(" ", 1) for part in thinking.split(", so")[0].split(", "))
        for name, count in stated.items():
            assert int(count) == sum(name in (colour, kind) for colour, kind in shapes), (name, thinking)
        # the reference earns both of the blog post's rewards
        assert strict_format([sample.reference]) == [0.5]
        assert correctness([sample.reference], [sample.fields["answer"]]) == [2.0]


def test_the_cell_walk_states_each_cell_and_numbers_what_it_counts():
    """reasoning=cells: the 16 cells in reading order, checked against the cell labels; the counted shapes are
    numbered 1..N in that order and N is the answer."""
    colours = list(COLOURS)
    data = RECIPE.build(split="train", size=60, seed=5, reasoning="cells")
    for i in range(len(data)):
        sample = data[i]
        question = sample.prompt[-1]["content"][-1]["text"]
        walk = sample.reference.split("<think>")[1].split("</think>")[0]
        rows = walk.split("; ")
        cells = [cell for row in rows for cell in row.split(", ")]
        assert len(rows) == 4 and len(cells) == 16, walk
        numbers = []
        for said, label in zip(cells, sample.fields["cells"]):
            if not label:
                assert said == "none", walk
                continue
            colour, kind = colours[(label - 1) // 3], KINDS[(label - 1) % 3]
            assert said.endswith(f"{colour} {kind}"), (said, colour, kind)
            counted = question == "How many shapes are in the image?" or f" {colour} " in question or f" {kind}s " in question
            assert said[0].isdigit() == counted, (question, said)
            if counted:
                numbers.append(int(said.split(" ")[0]))
        assert numbers == list(range(1, len(numbers) + 1)) and str(len(numbers)) == sample.fields["answer"]
        assert correctness([sample.reference], [sample.fields["answer"]]) == [2.0]


@pytest.mark.parametrize("split", ["train", "ood"])
def test_the_question_alone_does_not_give_the_answer(split):
    """Answers are uniform over 1..8 for each kind of question: the best guess from the question scores about 1 in 8
    (with scenes drawn first, most colour and kind answers were 1 or 2 and a guess scored 30%)."""
    from collections import Counter, defaultdict

    data = RECIPE.build(split=split, size=1200, seed=3)
    by_question: dict[str, Counter] = defaultdict(Counter)
    for i in range(len(data)):
        sample = data[i]
        text = sample.prompt[-1]["content"][-1]["text"]
        kind = "all" if text == "How many shapes are in the image?" else "colour" if text.split()[2] in COLOURS else "kind"
        by_question[kind][sample.fields["answer"]] += 1
    assert set(by_question) == {"all", "colour", "kind"}
    for kind, answers in by_question.items():
        assert set(answers) == {str(n) for n in range(1, 9)}, kind
        assert max(answers.values()) / sum(answers.values()) < 0.2, (kind, answers)
    best_guess = sum(max(answers.values()) for answers in by_question.values()) / len(data)
    assert best_guess < 0.2


@pytest.mark.parametrize("split", ["train", "test"])
def test_the_attribute_answer_is_the_one_shape_the_question_names(split):
    """Checked against the cell labels: exactly one shape has the kind (or colour) the question names, and the
    answer is its other attribute; the reference says so and earns both rewards."""
    colours = list(COLOURS)
    data = RECIPE.build(split=split, size=120, seed=5, task="attribute")
    asked_colour = 0
    for i in range(len(data)):
        sample = data[i]
        question = sample.prompt[-1]["content"][-1]["text"]
        shapes = [(colours[(v - 1) // 3], KINDS[(v - 1) % 3]) for v in sample.fields["cells"] if v]
        assert sample.fields["question_type"] == ("colour" if question.startswith("What colour") else "kind")
        if question.startswith("What colour is the "):
            asked_colour += 1
            kind = question.removeprefix("What colour is the ").removesuffix("?")
            named = [c for c, k in shapes if k == kind]
        else:
            colour = question.removeprefix("What shape is the ").removesuffix(" one?")
            named = [k for c, k in shapes if c == colour]
        assert len(named) == 1, (question, shapes)
        assert sample.fields["answer"] == named[0]
        assert strict_format([sample.reference]) == [0.5]
        assert correctness([sample.reference], [sample.fields["answer"]]) == [2.0]
        assert "word" in sample.prompt[0]["content"]
    assert 30 < asked_colour < 90


def test_attribute_questions_of_one_kind_only():
    both = RECIPE.build(split="train", size=60, seed=2, task="attribute")
    for asks, start in (("colour", "What colour is the "), ("kind", "What shape is the ")):
        data = RECIPE.build(split="train", size=60, seed=2, task="attribute", asks=asks)
        assert all(data[i].prompt[-1]["content"][-1]["text"].startswith(start) for i in range(60))
        assert all(data[i].fields["answer"] in (COLOURS if asks == "colour" else KINDS) for i in range(60))
    # the default asks both, as before the option existed
    assert {both[i].prompt[-1]["content"][-1]["text"].split()[1] for i in range(60)} == {"colour", "shape"}


def test_the_attribute_question_alone_does_not_give_the_answer():
    """Answers are uniform over the colours (or kinds) for each question, and the other shapes carry the answer's
    value too: neither the question nor the scene's commonest colour gives it away."""
    from collections import Counter, defaultdict

    data = RECIPE.build(split="ood", size=1500, seed=3, task="attribute")
    by_question: dict[str, Counter] = defaultdict(Counter)
    for i in range(len(data)):
        sample = data[i]
        by_question[sample.prompt[-1]["content"][-1]["text"]][sample.fields["answer"]] += 1
    assert len(by_question) == len(COLOURS) + len(KINDS)
    best_guess = sum(max(answers.values()) for answers in by_question.values()) / len(data)
    assert best_guess < 0.36
    train = RECIPE.build(split="train", size=400, seed=3, task="attribute")
    commonest_right = 0
    for i in range(len(train)):
        sample = train[i]
        if sample.fields["answer"] in COLOURS:
            held = Counter(list(COLOURS)[(v - 1) // 3] for v in sample.fields["cells"] if v)
            commonest_right += held.most_common(1)[0][0] == sample.fields["answer"]
    assert commonest_right < 0.7 * sum(train[i].fields["answer"] in COLOURS for i in range(len(train)))


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


def test_caption_states_every_colour_and_kind_count():
    sample = RECIPE.build(split="train", size=1, seed=2, task="caption")[0]
    assert sample.reference == sample.fields["answer"] and "<think>" not in sample.reference
    by_colour, by_kind = sample.reference.split("; ")
    colours = dict(p.split(" ") for p in by_colour.split(", "))
    kinds = dict(p.split(" ") for p in by_kind.split(", "))
    assert list(colours) == list(COLOURS) and list(kinds) == list(KINDS)
    n = sum(v > 0 for v in sample.fields["cells"])
    assert sum(map(int, colours.values())) == sum(map(int, kinds.values())) == n
    # the prompt gives the caption's layout (a frozen LM reads it from the text, not from the image tokens)
    assert "red N, green N, blue N, yellow N; circle N, square N, triangle N" in sample.prompt[-1]["content"][-1]["text"]


@pytest.mark.parametrize("option,value,message", [("split", "dev", "choose one of train, val, test, ood, ood_val"),
                                                  ("task", "vqa", "choose one of count, caption, attribute"),
                                                  ("image_size", 8, "at least 16 pixels"),
                                                  ("reasoning", "prose", "choose one of counts, cells"),
                                                  ("asks", "size", "choose one of both, colour, kind")])
def test_bad_options_are_refused_by_name(option, value, message):
    with pytest.raises(ValueError, match=message):
        RECIPE.build(**{option: value})


def test_validation_splits_are_other_draws_of_each_look():
    """Design choices are judged on val and ood_val: the same looks as test and ood, never the same questions."""
    def white(image):
        return sum(p == (255, 255, 255) for p in image.get_flattened_data()) / (image.width * image.height)

    drawn = {split: RECIPE.build(split=split, size=6, seed=1, task="attribute") for split in ("val", "test", "ood_val", "ood")}
    for a, b in (("val", "test"), ("ood_val", "ood")):
        assert [drawn[a][i].reference for i in range(6)] != [drawn[b][i].reference for i in range(6)]
    assert all(white(drawn["val"][i].images[0]) > 0.3 for i in range(6))
    assert all(white(drawn["ood_val"][i].images[0]) == 0 for i in range(6))
    assert "cells" in drawn["val"][0].fields and "cells" not in drawn["ood_val"][0].fields
