"""User code under fault (tests/reliability/faulty_user_code.py's corpus): what exits, raises, hangs, spins, blocks the
event loop or mutates its inputs never ends, stalls or corrupts the run, and each failure names the function.

Every case runs in a watched thread, so a case that hangs fails here (within its limit + 5 s) instead of hanging
the suite. Only public entry points are used: score, run_calls, Toolset, CallbackBridge.
"""

from __future__ import annotations

import copy
import inspect
import threading
import time
from types import SimpleNamespace

import psutil
import pytest
from PIL import Image
from transformers import TrainerState  # noqa: F401 - imported up front: a case's time is its own, not the import's

from tests.reliability import faulty_user_code as corpus
from vlm_grpo.grpo.rewards.inputs import RewardInputs
from vlm_grpo.grpo.rewards.weighted import score
from vlm_grpo.grpo.tools.calls import run_calls
from vlm_grpo.grpo.tools.toolset import Toolset
from vlm_grpo.recipes.base import Reward, Sample, user_turn

LIMIT = 0.3  # seconds a hang/spin case is given (tool_timeout / reward_timeout): they never end by themselves
GRACE = 5.0  # each case must end within LIMIT + GRACE
TEXTS = ["alpha", "beta"]


def watched(body):
    """body()'s (outcome, value, seconds), run in a daemon thread: ("hung", None, s) when it outlives LIMIT + GRACE."""
    box = {}

    def target():
        try:
            box["value"] = ("returned", body())
        except BaseException as err:  # noqa: BLE001 - the outcome under test
            box["value"] = ("raised", err)

    started = time.monotonic()
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(LIMIT + GRACE)
    seconds = time.monotonic() - started
    if thread.is_alive():
        return "hung", None, seconds
    return (*box["value"], seconds)


def cpu_seconds() -> float:
    times = psutil.Process().cpu_times()
    return times.user + times.system


# ---------------------------------------------------------------- how each kind is run
def reward_inputs() -> RewardInputs:
    return RewardInputs(list(TEXTS), {"answer": ["a", "b"]}, prompts=[[{"role": "user", "content": "q"}]] * 2,
                        completion_ids=[[1, 2], [3]], conversational=[False, False],
                        conversations=None)


def run_reward(fn, seen: list | None = None):
    def witness(completions, answer, prompts, completion_ids, **_):
        if seen is not None:
            seen.append(copy.deepcopy((completions, answer, prompts, completion_ids)))
        return [0.0] * len(completions)

    limit = {"timeout": LIMIT} if "timeout" in inspect.signature(score).parameters else {}
    inputs = reward_inputs()
    return score([Reward(fn.__name__, fn), Reward("witness", witness)], inputs, **limit), inputs


def run_tool(fn):
    return run_calls([{"name": fn.__name__, "arguments": {"x": 1}}], {fn.__name__: fn}, LIMIT)


def env_sample() -> Sample:
    return Sample(user_turn("q", 1), [Image.new("RGB", (8, 8))], {"answer": ["a"]})


def run_environment(cls, sample: Sample | None = None):
    return Toolset(environment_factory=cls).start([sample or env_sample()], 2)


def bridge_and_trainer(cls):
    from vlm_grpo.api.callbacks import CallbackBridge
    from vlm_grpo.api.schedule import Schedule

    trainer = SimpleNamespace(adapter=SimpleNamespace(model=None, processor=None), cfg=SimpleNamespace(max_steps=3),
                              is_main=True)
    from transformers import TrainingArguments

    bridge = CallbackBridge([cls], TrainingArguments(output_dir="unused", report_to="none"))
    bridge.schedule = Schedule(max_steps=3, steps_per_epoch=3)  # every step logged, as a run without TRL's fields
    bridge.state.max_steps, bridge.state.logging_steps = 3, 1
    return bridge, trainer


def run_callback(cls, metrics=None):
    bridge, trainer = bridge_and_trainer(cls)
    return bridge.step(trainer, metrics if metrics is not None else {"step": 1, "reward": 0.5})


RUNNERS = {"reward": lambda fn: run_reward(fn), "tool": run_tool, "environment": run_environment,
           "callback": run_callback}


def by_class(*classes):
    return [pytest.param(fn, kind, id=name) for name, cls, kind, fn in corpus.CASES if cls in classes]


def _named(err: BaseException, fn) -> bool:
    return fn.__name__ in str(err)


# ---------------------------------------------------------------- exit and raise: a named failure, exit code 1
@pytest.mark.parametrize("fn, kind", by_class("exit", "raise"))
def test_exits_and_raises_are_a_failure_naming_the_function(fn, kind):
    outcome, value, seconds = watched(lambda: RUNNERS[kind](fn))
    assert outcome == "raised", f"{kind} {fn.__name__}: {outcome} {value!r}"
    # an Exception the CLI reports in one line (exit 1), never SystemExit/KeyboardInterrupt ending the program
    assert isinstance(value, (ValueError, RuntimeError, OSError)), f"{type(value).__name__}: {value}"
    assert _named(value, fn) and "\n" not in str(value), str(value)
    assert ".py:" in str(value), f"no file:line in {value}"


# ---------------------------------------------------------------- hang, spin, async block: within the limit
@pytest.mark.parametrize("fn, kind", by_class("hang", "spin", "async_block"))
def test_hangs_spins_and_blocked_loops_end_within_the_limit(fn, kind):
    outcome, value, seconds = watched(lambda: RUNNERS[kind](fn))
    assert outcome != "hung" and seconds < LIMIT + GRACE, f"{fn.__name__} still running after {seconds:.1f} s"
    if kind == "tool":  # the model is told (TRL's way) and the call counts as a timeout
        assert outcome == "returned", f"{type(value).__name__}: {value}"
        assert value[0].failed and value[0].timed_out and "no result within" in str(value[0].content)
    else:  # on_reward_error raise: a named failure
        assert outcome == "raised" and _named(value, fn) and "timed out" in str(value), repr(value)


@pytest.mark.parametrize("fn, kind", by_class("spin", "async_block"))
def test_a_stopped_call_uses_no_cpu_once_the_step_moved_on(fn, kind):
    outcome, _, seconds = watched(lambda: RUNNERS[kind](fn))
    assert outcome != "hung"
    time.sleep(0.3)  # the stop is delivered in the background
    before = cpu_seconds()
    time.sleep(1.0)
    grown = cpu_seconds() - before
    assert grown < 0.25, f"{fn.__name__}: the process used {grown:.2f} s of CPU in the second after the timeout"


def test_the_shared_event_loop_still_serves_after_a_blocking_coroutine():
    outcome, value, _ = watched(lambda: run_tool(corpus.tool_async_block))
    assert outcome == "returned" and value[0].timed_out

    async def quick(x: int) -> str:
        """Answer.

        Args:
            x: echoed
        """
        return f"got {x}"

    outcome, value, seconds = watched(lambda: run_tool(quick))
    assert outcome == "returned" and value[0].content == "got 1" and seconds < 2


def test_process_isolation_kills_what_swallows_every_stop():
    from vlm_grpo.grpo.tools.calls import run_calls as calls

    def alive() -> set[int]:
        return {c.pid for c in psutil.Process().children() if c.is_running() and c.status() != psutil.STATUS_ZOMBIE}

    # Children that were here before (a forkserver another test in this process started) are not the call's.
    before = alive()
    fn = corpus.tool_spin_swallowing
    started = time.monotonic()
    result = calls([{"name": fn.__name__, "arguments": {"x": 1}}], {fn.__name__: fn}, LIMIT, isolation="process")
    assert result[0].timed_out and time.monotonic() - started < LIMIT + GRACE
    assert not alive() - before


def test_process_isolation_returns_results_and_names_failures():
    from vlm_grpo.grpo.tools.calls import run_calls as calls
    from vlm_grpo.grpo.user_calls import UserCodeError

    def crop(x: int) -> Image.Image:
        """Crop.

        Args:
            x: size
        """
        return Image.new("RGB", (x, x))

    result = calls([{"name": "crop", "arguments": {"x": 4}}], {"crop": crop}, LIMIT, isolation="process")
    assert result[0].images[0].size == (4, 4) and not result[0].failed
    fn = corpus.tool_exit_0
    with pytest.raises(UserCodeError, match=r"tool 'tool_exit_0' \(.*faulty_user_code.py:\d+\) called sys.exit\(0\)"):
        calls([{"name": fn.__name__, "arguments": {"x": 1}}], {fn.__name__: fn}, LIMIT, isolation="process")


def test_on_tool_error_raise_stops_on_a_timeout_naming_the_tool():
    from vlm_grpo.grpo.user_calls import UserCodeError

    fn = corpus.tool_sleep
    with pytest.raises(UserCodeError, match=rf"tool 'tool_sleep' .* timed out \(no result within {LIMIT:g} s\)"):
        run_calls([{"name": fn.__name__, "arguments": {"x": 1}}], {fn.__name__: fn}, LIMIT, on_error="raise")


def test_a_timed_out_reward_scores_zero_under_on_reward_error_zero():
    errors: dict[str, int] = {}
    started = time.monotonic()
    total, parts = score([Reward("slow", corpus.reward_sleep)], reward_inputs(), on_error="zero", errors=errors,
                         timeout=LIMIT)
    assert parts["slow"].tolist() == [0.0, 0.0] and errors == {"slow": 2}
    assert time.monotonic() - started < LIMIT + GRACE


# ---------------------------------------------------------------- mutate: nothing reaches the others or the logs
@pytest.mark.parametrize("fn", [p.values[0] for p in by_class("mutate") if p.values[1] == "reward"],
                         ids=[p.id for p in by_class("mutate") if p.values[1] == "reward"])
def test_a_reward_that_mutates_its_inputs_reaches_neither_the_other_rewards_nor_the_logs(fn):
    seen: list = []
    outcome, value, _ = watched(lambda: run_reward(fn, seen))
    assert outcome == "returned", repr(value)
    _, inputs = value
    fresh = reward_inputs()
    # the other reward saw the originals
    assert seen == [(list(TEXTS), ["a", "b"], fresh.prompts, fresh.completion_ids)]
    # what the logs are written from is untouched
    assert inputs.completions == TEXTS and inputs.fields == fresh.fields and inputs.prompts == fresh.prompts
    assert inputs.completion_ids == fresh.completion_ids


def test_a_reward_that_mutates_conversations_leaves_the_logged_conversation():
    conversation = [{"role": "assistant", "content": "hi"}, {"role": "tool", "name": "t", "content": "x"}]
    inputs = RewardInputs(["hi"], {}, conversations=[conversation])
    score([Reward("m", corpus.reward_mutates_messages)], inputs)
    assert conversation[0]["content"] == "hi"


def test_an_environment_reset_that_mutates_its_row_leaves_the_sample():
    sample = env_sample()
    outcome, value, _ = watched(lambda: run_environment(corpus.EnvResetMutates, sample))
    assert outcome == "returned", repr(value)
    assert sample.fields == {"answer": ["a"]} and len(sample.images) == 1


def test_a_callback_that_mutates_the_logs_leaves_the_metrics():
    metrics = {"step": 1, "reward": 0.5}
    bridge, trainer = bridge_and_trainer(corpus.CallbackMutatesLogs)
    bridge.step(trainer, metrics)
    assert metrics == {"step": 1, "reward": 0.5}
    assert [(e["step"], e["reward"]) for e in bridge.state.log_history] == [(1, 0.5)]


def test_the_corpus_covers_every_class():
    classes = [c for _, c, _, _ in corpus.CASES]
    assert len(corpus.CASES) >= 30
    assert {c: classes.count(c) for c in set(classes)} == {
        "exit": 13, "raise": 5, "hang": 6, "spin": 4, "async_block": 3, "mutate": 7}
