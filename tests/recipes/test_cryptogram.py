"""cryptogram: deterministic decoder images, the blog's gated edit-distance rewards, a 2-step run."""

import pytest

from tests.recipes.helpers import same_sample, smoke_train
from vlm_grpo.recipes import get_recipe
from vlm_grpo.recipes.cryptogram import build, correctness, decoding, encode, format_reward, spell, word_list
from vlm_grpo.recipes.rewards import edit_distance, similarity

# "i can see" under a cipher with i->x, c->q, a->r, n->m, s->z, e->b.
ANSWER, CODED = "i can see", "x _ q r m _ z b b"


def reply(chars: str, answer: str, think: str = "x->i, q->c, r->a, m->n, z->s, b->e") -> str:
    return f"<think>{think}</think>\n<chars> {chars} </chars>\n<answer>{answer}</answer>"


def scores(text: str) -> tuple[float, float, float]:
    kw = {"answer": [ANSWER], "coded": [CODED]}
    return format_reward([text])[0], decoding([text], **kw)[0], correctness([text], **kw)[0]


def test_edit_distance_and_similarity_by_hand():
    assert edit_distance("kitten", "sitting") == 3
    assert edit_distance("", "abc") == 3 and edit_distance("abc", "abc") == 0
    assert similarity("", "") == 1.0
    assert similarity("sight", "sights") == pytest.approx(1 - 1 / 6)
    # the coded message differs from the truth in 7 of its 9 symbols
    assert edit_distance("x_qrm_zbb", "i_can_see") == 7


def test_perfect_reply_earns_full_credit():
    assert scores(reply("i _ c a n _ s e e", "i can see")) == (1.0, 1.0, 1.0)
    # spacing and case do not matter: characters compare without whitespace, answers squashed
    assert scores(reply("i_can_see", "  I  Can SEE ")) == (1.0, 1.0, 1.0)


def test_echoing_the_coded_message_earns_nothing():
    assert scores(reply(CODED, "x qrm zbb")) == (1.0, 0.0, 0.0)
    # as far from the truth as the coded message (7 edits) but different: still gated out
    assert scores(reply("a _ b c d _ f g h", "i can see")) == (1.0, 0.0, 0.0)


def test_partial_credit_values():
    # one wrong character of 9: decoding 8/9; correctness needs a perfect decoding, so 0
    assert scores(reply("i _ c a n _ s e a", "i can see")) == pytest.approx((1.0, 8 / 9, 0.0))
    # perfect characters, one wrong letter in a 9-character answer: 8/9
    assert scores(reply("i _ c a n _ s e e", "i can sea")) == pytest.approx((1.0, 1.0, 8 / 9))
    # an answer that is no closer than the coded words earns nothing even after a perfect decoding
    assert scores(reply("i _ c a n _ s e e", "x qrm zbb")) == (1.0, 1.0, 0.0)


def test_format_needs_all_three_blocks_in_order():
    assert scores("i can see") == (0.0, 0.0, 0.0)
    out_of_order = "<answer>i can see</answer><chars> i _ c a n _ s e e </chars><think>t</think>"
    assert format_reward([out_of_order]) == [0.0]
    assert format_reward(["<think>t</think><answer>i can see</answer>"]) == [0.0]


def test_samples_are_deterministic_and_well_formed():
    a, b = build(size=8, seed=3), build(size=8, seed=3)
    assert all(same_sample(a[i], b[i]) for i in range(8))
    assert not same_sample(a[0], build(size=8, seed=4)[0])
    assert not same_sample(a[0], build(split="test", size=8, seed=3)[0])
    words = set(word_list())
    for i in range(8):
        s = a[i]
        message, coded = s.fields["answer"], s.fields["coded"]
        assert 1 <= len(message.split()) <= 3 and set(message.split()) <= words
        assert all(len(tok) == 1 and (tok.isalpha() or tok == "_") for tok in coded.split())
        assert coded.count("_") == len(message.split()) - 1
        assert coded != spell(message)  # the cipher never maps a letter to itself
        assert coded in s.prompt[0]["content"][-1]["text"]
        assert s.images[0].mode == "RGB" and s.images[0].size == (584, 232)
        # the reference reply earns full credit
        kw = {"answer": [message], "coded": [coded]}
        ref = [s.reference]
        assert (format_reward(ref), decoding(ref, **kw), correctness(ref, **kw)) == ([1.0], [1.0], [1.0])


def test_encode_and_options():
    cipher = {ch: ch for ch in "abcdefghijklmnopqrstuvwxyz"} | {"i": "x", "c": "q", "a": "r", "n": "m", "s": "z", "e": "b"}
    assert encode(ANSWER, cipher) == CODED
    small = build(size=2, seed=0, image_size=112, max_words=1, path="ignored")
    assert max(small[0].images[0].size) == 112 and len(small[1].fields["answer"].split()) == 1
    with pytest.raises(IndexError):
        small[2]
    recipe = get_recipe("cryptogram")
    assert recipe.accuracy_reward == "correctness"
    assert [r.name for r in recipe.rewards] == ["format", "decoding", "correctness"]


def test_two_grpo_steps(tmp_path):
    history = smoke_train("cryptogram", tmp_path, "{image_size: 112}")
    assert len(history) == 2 and {"rewards/format", "rewards/decoding", "rewards/correctness"} <= set(history[-1])
