"""A corpus of broken rewards: `vlm-grpo audit-rewards` exits 1 on each, naming the adversary that beats it."""

from __future__ import annotations

import pytest

from vlm_grpo.cli import main

CORPUS = {  # reward -> what the audit must say
    "last_word_in": "pays empty (content-free)",
    "starts_with": "pays empty (content-free)",
    "empty_regex": "cannot tell right from wrong",
    "in_reversed": "pays empty (content-free)",
    "length": "pays padding (content-free)",
    "constant": "ignores the answer",
    "raises_on_empty": "raises on empty",
    "ignores_answer": "ignores the answer",
}


@pytest.mark.parametrize("name", list(CORPUS))
def test_a_broken_reward_is_flagged_with_exit_1_naming_the_adversary(name, capsys):
    spec = f"{name}=tests.reliability.broken_rewards:{name}"
    assert main(["audit-rewards", "--samples", "4", "--reward", spec, "--data.recipe_options", "{image_size: 64}"]) == 1
    flags = [line for line in capsys.readouterr().out.splitlines() if line.startswith("FLAG: ")]
    assert any(CORPUS[name] in line for line in flags), flags
