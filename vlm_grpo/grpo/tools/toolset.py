"""A run's tools with TRL 1.16's contract: `tools` (typed functions, sync or async) and `environment_factory`.

An environment is a class (any callable returning an instance); its public methods are tools, `reset(**row)` runs
before each rollout (a returned string or list of parts is appended to the prompt's last user message) and an
optional `get_reward()` scores the rollout (a reward named after the class, weight 1). A dict of environments
picks one per sample by the sample's `environment` field. One instance serves one rollout at a time; instances are
pooled and reset, never rebuilt per batch, as TRL does.

Here a prompt is encoded once for its G rollouts, so the G resets of a sample must give the same observation.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import copy

from vlm_grpo.grpo.rewards.inputs import reward_prompt
from vlm_grpo.grpo.tools.calls import ToolResult, run_calls
from vlm_grpo.grpo.user_calls import call
from vlm_grpo.grpo.user_code import load_object
from vlm_grpo.recipes.base import Reward, Sample
from vlm_grpo.recipes.tool_rewards import on_final_answer


def load_tool(spec: str) -> Callable:
    """`module:function` or `file.py:function`."""
    fn = load_object(spec, "tool", noun="function")
    if not callable(fn):
        raise ValueError(f"tool {spec!r} is a {type(fn).__name__}, not a function")
    return fn


def load_environment(spec: str) -> Any:
    """`module:Class` or `file.py:Class` (or a dict NAME of classes, selected by the `environment` field)."""
    factory = load_object(spec, "environment", noun="class")
    if not callable(factory) and not isinstance(factory, dict):
        raise ValueError(f"environment {spec!r} is a {type(factory).__name__}, not a class or a dict of classes")
    return factory


def run_toolset(recipe, specs=(), environment: str | None = None, *, recipe_tools: bool = True,
                timeout: float | None = None, tools=(), environment_factory=None, isolation: str = "thread",
                on_error: str = "model") -> "Toolset":
    """A run's tools: the recipe's (unless `recipe_tools` is off), those named in the settings (`specs`), those
    passed in Python (`tools`); the environment passed in Python wins over the one named, which wins over the
    recipe's."""
    functions = [*(getattr(recipe, "tools", []) if recipe_tools else []), *(load_tool(s) for s in specs), *tools]
    if environment_factory is None:
        environment_factory = load_environment(environment) if environment else \
            (getattr(recipe, "environment", None) if recipe_tools else None)
    return Toolset(functions, environment_factory, timeout=timeout or None, isolation=isolation, on_error=on_error)


def final_message_rewards(recipe, rewards: list[Reward]) -> list[Reward]:
    """The run's rewards with tools on: those of a recipe that ships no tools (written for a one-turn text answer)
    read each rollout's final message; the rest (the user's, a tool recipe's) get the whole conversation (TRL)."""
    if getattr(recipe, "tools", None) or getattr(recipe, "environment", None):
        return rewards
    own = {id(r.fn) for r in getattr(recipe, "rewards", [])}
    return [Reward(r.name, on_final_answer(r.fn), r.weight) if id(r.fn) in own else r for r in rewards]


def _methods(instance: Any) -> list[Callable]:
    """An environment's tools: its public functions other than reset and get_reward (listed on the class, so no
    property is evaluated)."""
    return [getattr(instance, name) for name, _ in inspect.getmembers(type(instance), predicate=inspect.isfunction)
            if name not in ("reset", "get_reward") and not name.startswith("_")]


def _accepted(fn: Callable, kwargs: dict[str, Any]) -> dict[str, Any]:
    params = inspect.signature(fn).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return kwargs
    return {k: v for k, v in kwargs.items() if k in {p.name for p in params}}


def _append(prompt: list[dict], observation: Any) -> list[dict]:
    """TRL's rule: an observation is appended to the last message's content (a copy; the sample stays untouched)."""
    last = prompt[-1]
    content = last["content"]
    if isinstance(observation, list) and isinstance(content, str):
        content = [{"type": "text", "text": content}]
    if isinstance(observation, str) and isinstance(content, list):
        observation = [{"type": "text", "text": observation}]
    return [*prompt[:-1], {**last, "content": content + observation}]


class Toolset:
    """The run's standalone tools and environment classes."""

    def __init__(self, tools=(), environment_factory=None, timeout: float | None = None, isolation: str = "thread",
                 on_error: str = "model"):
        self.tools = list(tools)
        self.isolation, self.on_error = isolation, on_error
        for tool in self.tools:
            if not callable(tool):
                raise ValueError(f"tool {tool!r} is not callable: a tool is a typed function with a docstring")
        self.timeout = timeout
        self.multi = isinstance(environment_factory, dict)
        self.factories = ({} if environment_factory is None else
                          dict(environment_factory) if self.multi else {None: environment_factory})
        self.pool: dict[Any, list[Any]] = {}
        self.reward_classes: list[type] = []
        for name, factory in self.factories.items():
            instance = _build(factory)
            members = dict(inspect.getmembers(type(instance), predicate=inspect.isfunction))
            if "reset" not in members:
                raise ValueError(f"environment {getattr(factory, '__name__', name)!r}: it must define reset() "
                                 "(TRL's environment contract)")
            self.pool[name] = [instance]
            if "get_reward" in members and type(instance) not in self.reward_classes:
                self.reward_classes.append(type(instance))
        names = [t.__name__ for t in self.tools]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"two tools are named {twice[0]!r}: the model calls tools by name")

    @property
    def enabled(self) -> bool:
        return bool(self.tools or self.factories)

    def rewards(self) -> list[Reward]:
        """One reward per environment class with get_reward (TRL names it after the class, weight 1)."""
        def for_class(cls: type) -> Callable:
            def get_reward(environments, **_):
                return [e.get_reward() if type(e) is cls else None for e in environments]
            return get_reward

        return [Reward(cls.__name__, for_class(cls)) for cls in self.reward_classes]

    def start(self, samples: list[Sample], num_generations: int, rows: list[int] | None = None,
              step: int | None = None) -> "ToolSession":
        """A batch's rollouts: an environment instance each (reset with its sample's row) and its tools; `rows` (the
        samples' dataset rows) and `step` name where a failing reset or tool was."""
        names = [s.fields.get("environment") if self.multi else None for s in samples]
        unknown = sorted({repr(n) for n in names if n not in self.factories}) if self.factories else []
        if unknown:
            raise ValueError(f"sample field 'environment' is {unknown[0]}, not one of the environments given "
                             f"({', '.join(map(repr, self.factories))})")
        handed: dict[Any, int] = {}
        environments, prompts, images = [], [], []
        for i, (sample, name) in enumerate(zip(samples, names)):
            prompt, first = sample.prompt, None
            for g in range(num_generations if self.factories else 0):
                pool, k = self.pool[name], handed.get(name, 0)
                if k == len(pool):
                    pool.append(_build(self.factories[name]))
                handed[name] = k + 1
                env = pool[k]
                row = {"prompt": reward_prompt(sample), "images": list(sample.images), **sample.fields}
                if self.multi:
                    row.pop("environment", None)
                where = {"sample": _sample_name(i, rows), "step": step}
                # its own copy of the row: an edit must not reach the sample, the other rollouts or the rewards
                observation = call("environment reset", env.reset, context=where,
                                   via=lambda f, kw=copy.deepcopy(_accepted(env.reset, row)): f(**kw))
                if g == 0:
                    first = observation
                elif observation != first:
                    raise ValueError(f"sample {i}: the environment's reset() gave its {num_generations} rollouts "
                                     "different observations; here a prompt is encoded once for its group, so reset "
                                     "must give every rollout of a sample the same one")
                environments.append(env)
            if first is not None:
                prompt = _append(prompt, first)
            prompts.append(prompt)
            shown = first if isinstance(first, list) else []  # an observation's own image parts follow the sample's
            images.append([*sample.images, *(p["image"] for p in shown if isinstance(p, dict) and p.get("type") == "image")])
        n = len(samples) * num_generations  # each rollout calls the methods of its own instance
        tools = [self.tools + (_methods(environments[r]) if self.factories else []) for r in range(n)]
        return ToolSession(prompts, images, tools, environments or None, self.timeout, num_generations,
                           isolation=self.isolation, on_error=self.on_error, rows=rows, step=step)


@dataclass
class ToolSession:
    """One batch's rollouts with tools (N = B*G rows, group-contiguous)."""

    prompts: list[list[dict]]  # [B] the prompts with the environments' observations
    images: list[list[Any]]  # [B] each prompt's images
    tools: list[list[Callable]]  # [N] the tools each rollout may call
    environments: list[Any] | None  # [N] each rollout's environment instance (None: no environments)
    timeout: float | None
    num_generations: int
    conversations: list[list[dict]] = field(default_factory=list)  # [B] as the chat format writes them (format())
    template_tools: list[list | None] = field(default_factory=list)  # [B] the tools a native template describes
    isolation: str = "thread"  # where a standalone tool with a time limit runs (thread | process)
    on_error: str = "model"  # a failed call: its error to the model, or raise
    rows: list[int] | None = None  # [B] each sample's dataset row (messages)
    step: int | None = None

    def sample_tools(self, i: int) -> list[Callable]:
        return self.tools[i * self.num_generations]

    def format(self, fmt) -> "ToolSession":
        """The prompts with their tools described in `fmt` (a ChatFormat): ready for `encode_prompts`."""
        written = [fmt.prompt(p, self.sample_tools(i)) for i, p in enumerate(self.prompts)]
        self.conversations = [c for c, _ in written]
        self.template_tools = [t for _, t in written]
        return self

    def run(self, row: int, calls: list[dict]) -> list[ToolResult]:
        functions = {getattr(fn, "__name__", str(fn)): fn for fn in self.tools[row]}
        where = {"sample": f"rollout {row} ({_sample_name(row // self.num_generations, self.rows)})", "step": self.step}
        return run_calls(calls, functions, self.timeout, self.isolation, self.on_error, where)


def _sample_name(i: int, rows: list[int] | None) -> str:
    return f"sample {i}" + (f", dataset row {rows[i]}" if rows is not None else "")


def _build(factory: Any) -> Any:
    """An environment instance (its constructor is user code: a failure names it)."""
    return call("environment", factory)
