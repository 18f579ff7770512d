"""The reward audit: adversarial completions scored with a run's rewards flag exploitable ones, and every shipped
recipe's audit result is what docs/guards.md states."""

from __future__ import annotations

import re
import types

import pytest

from tests.recipes.helpers import save_image, write_jsonl
from vlm_grpo.cli import main
from vlm_grpo.grpo.rewards.audit import ADVERSARIES, adversarial_completions, audit_rewards
from vlm_grpo.recipes import RECIPES, get_recipe
from vlm_grpo.recipes.audit_hints import DEFAULT_HINTS, generic_candidates
from vlm_grpo.recipes.base import Reward
from vlm_grpo.recipes.rewards import answer_or_text


def _last_number(text: str) -> str:
    return (re.findall(r"\d+", answer_or_text(text)) or [""])[-1]


def substring_accuracy(completions, answer, **_):
    """The planted exploit: the stated number `in` the truth, which holds for no number at all ("" is in every string)."""
    return [1.0 if _last_number(c) in str(a) else 0.0 for c, a in zip(completions, answer)]


def honest_accuracy(completions, answer, **_):
    return [1.0 if _last_number(c) == str(a) else 0.0 for c, a in zip(completions, answer)]


def shapes_samples(n=8):
    data = get_recipe("shapes").build(size=n, image_size=64)
    return [data[i] for i in range(n)]


def test_a_substring_check_an_empty_answer_passes_is_flagged():
    hints = get_recipe("shapes").audit
    report = audit_rewards([Reward("accuracy", substring_accuracy)], shapes_samples(), hints)
    flagged = {(f.component, f.adversary) for f in report.flags()}
    assert ("accuracy", "empty") in flagged  # "" in "3"
    assert report.means[("empty", "accuracy")] == 1.0 and report.means[("wrong_answer", "accuracy")] == 0.0
    assert report.above_wrong[("empty", "accuracy")] == 1.0  # every sample: above the wrong answer's score
    assert "1.00 (100%) !" in report.table()
    # the same task checked honestly is not flagged; the right answer outside the form may score (it is right)
    honest = audit_rewards([Reward("accuracy", honest_accuracy)], shapes_samples(), hints)
    assert honest.flags() == [] and honest.means[("right_answer_bare", "accuracy")] == 1.0
    # accepting the finding by name
    content_free = ("empty", "whitespace", "format_only", "echo", "padding")  # none states a number
    assert flagged == {(c, a) for c in ("accuracy", "total") for a in content_free}  # the total: paid above a wrong one
    assert report.flags(allow=["accuracy:empty", "whitespace", "format_only", "echo", "padding"]) == []


def test_the_adversaries_of_a_sample():
    sample = shapes_samples(1)[0]
    texts = adversarial_completions(sample, get_recipe("shapes").audit)
    assert list(texts) == list(ADVERSARIES) and texts["empty"] == ""
    answer = sample.fields["answer"]
    assert texts["right_answer_bare"] == answer and texts["repeat"].split() == [answer] * 16
    assert texts["enumerate"].endswith("is 1 2 3 4 5.") and texts["echo"] == f"How many {sample.fields['target']} are in the image?"
    assert texts["wrong_answer"].endswith(".") and not texts["wrong_answer"].endswith(f" {answer}.")
    assert generic_candidates("yes") == ["Yes", "No"] and generic_candidates("C") == ["A", "B", "C", "D", "E"]
    assert generic_candidates("42") == ["40", "41", "42", "43", "44"] and generic_candidates("a cat") == []


@pytest.fixture(scope="module")
def row_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit-rows")
    for i in range(6):
        save_image(root / f"img{i}.png", i)
    files = {
        "vsr": write_jsonl(root / "vsr.jsonl", [{"image": f"img{i}.png", "caption": "The dog is on the bed.", "label": i % 2}
                                               for i in range(6)]),
        "clevr_count": write_jsonl(root / "clevr.jsonl", [{"image": f"img{i}.png", "problem": "How many objects?",
                                                            "solution": f"<answer>{i + 1}</answer>"} for i in range(6)]),
        "mm_math": write_jsonl(root / "mm.jsonl", [{"image": f"img{i}.png", "problem": "What is x?", "solution": s}
                                                   for i, s in enumerate(["<answer>\\frac{1}{2}</answer>", "3", "B", "12",
                                                                          "<answer>45</answer>", "yes"])]),
        "trl": write_jsonl(root / "trl.jsonl", [{"prompt": "Which animal?", "image": str(root / f"img{i}.png"),
                                                 "solution": w} for i, w in enumerate(["cat", "dog", "bird", "cat",
                                                                                       "dog", "fish"])]),
    }
    return files


# docs/guards.md: the audit of every shipped recipe
@pytest.mark.parametrize("name, accepted", [
    ("shapes", {("description", "format_only"), ("description", "echo"), ("reasoning", "format_only")}),
    ("cryptogram", set()), ("vsr", set()), ("clevr_count", set()), ("mm_math", set()),
])
def test_every_shipped_recipe_audits_clean_or_documents_its_exploit(name, accepted, row_files):
    recipe = get_recipe(name)
    options = {"path": str(row_files[name])} if name in row_files else {"image_size": 64} if name == "shapes" else {}
    data = recipe.build(split="train", size=6, seed=0, **options)
    report = audit_rewards(recipe.rewards, [data[i] for i in range(6)], recipe.audit)
    assert report.flags() == [] and not report.errors
    assert {(f.component, f.adversary) for f in report.findings} == accepted
    assert all(report.means[("reference", r.name)] > 0 for r in recipe.rewards)  # the yardstick earns every reward
    if name != "shapes":  # the format rewards' old exploit, fixed: empty tags earn nothing
        assert all(report.means[("format_only", r.name)] == 0 for r in recipe.rewards)


def test_the_trl_recipe_uses_the_r1_defaults(row_files, tmp_path):
    rows = [{"prompt": "How many?", "image": str(row_files["vsr"].parent / f"img{i}.png"), "solution": str(i + 1)}
            for i in range(4)]
    recipe = get_recipe("trl")
    data = recipe.build(path=str(write_jsonl(tmp_path / "trl.jsonl", rows)))
    report = audit_rewards([Reward("accuracy", lambda completions, solution, **_: substring_accuracy(completions, solution))],
                           [data[i] for i in range(4)], recipe.audit)
    assert recipe.audit is None and report.examples["format_only"] == DEFAULT_HINTS.layout(data[0], "", "")
    assert ("accuracy", "empty") in {(f.component, f.adversary) for f in report.flags()}


def test_the_command_exits_1_on_a_flag_unless_allowed(tmp_path, capsys):
    reward = str(__file__).replace(".py", ".py:substring_accuracy")
    args = ["audit-rewards", "--samples", "4", "--reward", f"accuracy={reward}", "--data.recipe_options",
            "{image_size: 64}"]
    assert main(args + ["--json", str(tmp_path / "audit.json")]) == 1
    out = capsys.readouterr().out
    assert "FLAG: reward 'accuracy' pays empty (content-free) 1" in out and "exploits flagged" in out
    assert (tmp_path / "audit.json").is_file()
    assert main(args + ["--allow", "accuracy"]) == 0
    assert "0 exploits flagged" in capsys.readouterr().out
    assert main(["audit-rewards", "--samples", "4"]) == 0  # the default run: shapes' shaping rewards are accepted
    assert "accepted by the recipe" in capsys.readouterr().out


def never_answers(completions, **_):  # a judge whose server never replies: blocks until stopped
    import threading

    threading.Event().wait()


def test_the_command_calls_rewards_under_the_reward_timeout(capsys):
    reward = str(__file__).replace(".py", ".py:never_answers")
    assert main(["audit-rewards", "--samples", "1", "--reward", f"judge={reward}", "--reward-timeout", "0.2",
                 "--allow", "judge", "--data.recipe_options", "{image_size: 64}"]) == 0
    assert "rewards that raised on adversarial completions (scored 0): {'judge':" in capsys.readouterr().out


def answer_anywhere(hints):
    """The exploit: pays any completion that contains the row's answer somewhere (`answer in text`)."""
    def anywhere(completions, **columns):
        out = []
        for k, text in enumerate(completions):
            row = {name: values[k] for name, values in columns.items()
                   if isinstance(values, list) and len(values) == len(completions)}
            answer = hints.answer(types.SimpleNamespace(fields=row, reference=None, prompt=[]))
            out.append(1.0 if answer and answer.lower() in text.lower() else 0.0)
        return out

    return anywhere


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_reward_paying_the_answer_anywhere_is_flagged_on_every_recipe(name, row_files):
    recipe = get_recipe(name)
    options = {"path": str(row_files[name])} if name in row_files else {"image_size": 64} if name == "shapes" else {}
    data = recipe.build(split="train", size=6, seed=0, **options)
    hints = recipe.audit or DEFAULT_HINTS
    report = audit_rewards([Reward("anywhere", answer_anywhere(hints))], [data[i] for i in range(6)], recipe.audit)
    assert report.means[("reference", "anywhere")] == 1.0  # the reward does pay the right answer
    flagged = {(f.component, f.adversary) for f in report.flags()}
    assert ("anywhere", "enumerate") in flagged, (report.table(), report.candidates)
    assert all(k > 1 for k in report.candidates)  # every row has a space of answers to enumerate


def test_the_answer_space_of_a_free_text_task_is_its_rows_answers():
    from vlm_grpo.grpo.rewards.audit import answer_space

    recipe = get_recipe("cryptogram")
    data = recipe.build(split="train", size=4, seed=0)
    samples = [data[i] for i in range(4)]
    space = answer_space(samples, recipe.audit)
    answers = [recipe.audit.answer(s) for s in samples]
    assert [row[0] for row in space] == answers and all(set(row) == set(answers) for row in space)
    assert adversarial_completions(samples[0], recipe.audit, candidates=space[0])["enumerate"].count(answers[1]) == 1
    # a user dataset's wrong answer is another answer of the task, not a made-up word
    assert DEFAULT_HINTS.wrong(samples[0], "cat", ["cat", "dog"]) == "dog" and DEFAULT_HINTS.wrong(samples[0], "cat") == "none"
