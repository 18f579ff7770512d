"""The reward audit: before a run, the run's rewards score adversarial completions of real samples.

For each sample the recipe's audit hints (recipes/audit_hints.py) give the right answer, the answers the task
allows (where the recipe names none, the task's answer space: the distinct right answers of the audited rows, as a
user dataset's answer column holds them) and the layout of a finished completion; from them come completions that should not earn what a right
answer earns. A component is *flagged* when it pays a right answer something (mean above 0) and pays an adversary
at least as much (within 5%), judged only where that adversary should lose:

- content-free adversaries (empty, format_only, echo, padding) should lose on every component;
- `enumerate` (every allowed answer, in the form) should lose on components that tell a right answer from a wrong
  one (answer-sensitive: the reference beats `wrong_answer` on them);
- the right answer outside the form (`right_answer_bare`, `repeat`) should lose on the other components (a format
  reward should not pay an unformatted answer; an answer checker may).

`wrong_answer` (the form with a wrong answer) is the baseline of the "share above a wrong answer" column and
`reference` (the recipe's reference response, else the form with the right answer) is the yardstick.

The reward is also judged by its own behaviour, whatever it pays the reference (a broken check may pay it 0):
- the run's total must pay `reference` more than `wrong_answer` ("cannot tell right from wrong");
- no degenerate completion (empty, whitespace, the format alone, the question echoed, padding) may earn a larger
  total than `wrong_answer`, nor every candidate listed (`enumerate`) more than a guess among them would (a wrong
  answer's total plus 1/K of the way to the reference's, for K candidates);
- a component whose score is the same for every completion of each audited row ignores the answer;
- a component that raises on an adversary is flagged, naming it (the step would fail, or score 0, on such a
  completion).
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from vlm_grpo.grpo.rewards.audit_bounds import (
    MAX_AUDIT_ROWS, MAX_LISTED, NO_BUDGET_CHARS, CompletionCut, bounded_answer, clipped_sample, first_fitting,
    longest_fitting, text_fits,
)
from vlm_grpo.grpo.rewards.inputs import RewardInputs, collect_fields, reward_prompt, trainer_state
from vlm_grpo.grpo.rewards.weighted import score
from vlm_grpo.recipes.audit_hints import DEFAULT_HINTS, AuditHints
from vlm_grpo.recipes.base import Reward, Sample

CONTENT_FREE, WRONG_IN_FORM, RIGHT_OUT_OF_FORM, BASELINE, REFERENCE = (
    "content-free", "wrong answer in the form", "right answer out of the form", "baseline", "reference")
ADVERSARIES: dict[str, str] = {  # name -> kind, in table order
    "empty": CONTENT_FREE,
    "whitespace": CONTENT_FREE,
    "format_only": CONTENT_FREE,
    "echo": CONTENT_FREE,
    "enumerate": WRONG_IN_FORM,
    "repeat": RIGHT_OUT_OF_FORM,
    "right_answer_bare": RIGHT_OUT_OF_FORM,
    "wrong_answer": BASELINE,
    "padding": CONTENT_FREE,
    "reference": REFERENCE,
}
TOLERANCE = 0.05  # an adversary within 5% of the right answer's mean counts as "as well"
REPEATS = 16
STUB = "I looked at the image."  # the reasoning of the formatted wrong answer and of the enumeration
FILLER = "Let me look at the image carefully and think about the question before I give my final reply. "


def question_text(sample: Sample, most: int | None = None) -> str:
    """The user turns' text, as the model read it (its first `most` characters when given)."""
    texts, length = [], 0
    for message in sample.prompt:
        if message.get("role") != "user":
            continue
        content = message.get("content")
        parts = [content] if isinstance(content, str) else [p.get("text", "") for p in content or [] if p.get("type") == "text"]
        texts += [t for t in parts if t]
        length += sum(len(t) + 1 for t in parts if t)
        if most is not None and length > most:  # a longer question is read no further
            break
    text = " ".join(texts).strip()
    return text if most is None else text[:most]


MAX_CANDIDATES = 8  # answers of the task listed by the enumeration when the recipe names none


def answer_space(samples: Sequence[Sample], hints: AuditHints,
                 answers: Sequence[str | None] | None = None) -> list[list[str]]:
    """Each row's candidate answers: the recipe's (`hints.candidates`, at most MAX_LISTED); where it names fewer than
    two (free text, a user dataset's column), the task's own answers: the distinct right answers of the audited
    rows, the row's own first, at most MAX_CANDIDATES. An enumeration of them, and a wrong answer drawn from them, are
    answers the task really takes, not a made-up word a check would never match. `answers`: each row's right answer
    (default: the hints')."""
    answers = [hints.answer(s) for s in samples] if answers is None else list(answers)
    distinct = list(dict.fromkeys(a for a in answers if a is not None))
    space = []
    for sample, answer in zip(samples, answers):
        if answer is None:
            space.append([])
            continue
        own = list(itertools.islice(hints.candidates(sample, answer), MAX_LISTED))
        if len(own) < 2:
            others = [a for a in distinct if a.strip().lower() != answer.strip().lower()]
            own = [answer, *others[: MAX_CANDIDATES - 1]] if others else own
        space.append(own)
    return space


def _same(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _enumeration(sample: Sample, hints: AuditHints, answer: str, candidates: list[str],
                 fits: Callable[[str], bool]) -> tuple[str | None, int]:
    """(the form listing as many candidate answers as fit, each whole, the right one among them; how many it lists).
    More answers go before a fuller form (the reasoning, an empty think block); two answers at least."""
    right = next((k for k, c in enumerate(candidates) if _same(c, answer)), None)

    def listing(k: int) -> list[str]:
        # k neighbours in the task's order, the right one placed as far along them as it is along all of them:
        # a check that reads the last (or first) answer is then paid about 1/k of the time, as a guess would be
        if right is None:
            return candidates[:k]
        start = round(right * (len(candidates) - k) / max(1, len(candidates) - 1))
        return candidates[start:start + k]

    best: tuple[int, str] | None = None
    for form in range(len(hints.forms(sample, STUB, answer))):
        found = longest_fitting(lambda k: hints.forms(sample, STUB, " ".join(listing(k)))[form], len(candidates), fits,
                                least=2)
        if found and (best is None or found[0] > best[0]):
            best = found
    return (best[1], len(listing(best[0]))) if best else (None, 0)


def _words_that_fit(text: str, fits: Callable[[str], bool]) -> str | None:
    """The longest run of `text`'s first words that fits, its own spacing kept."""
    ends = [m.end() for m in re.finditer(r"\S+", text)]
    if not ends:
        return text.strip() if fits(text.strip()) else None
    found = longest_fitting(lambda n: text[: ends[n - 1]], len(ends), fits)
    return found[1] if found else None


def build_adversaries(sample: Sample, hints: AuditHints, answer: str | None, candidates: list[str], *,
                      words: int = 120, fits: Callable[[str], bool] = lambda text: True,
                      max_chars: int = NO_BUDGET_CHARS) -> tuple[dict[str, str | None], int]:
    """(each adversary's completion, each built to fit so what it claims survives the cut: None where it cannot be
    written within the budget or without a right answer; the number of answers the enumeration lists)."""
    filler = FILLER * (min(words, max_chars) // len(FILLER.split()) + 1)
    out: dict[str, str | None] = {
        "empty": "", "whitespace": first_fitting([" \n\t "], fits),
        "format_only": first_fitting([hints.layout(sample, "", "")], fits),
        "echo": _words_that_fit(question_text(sample, max_chars), fits),
        "padding": _words_that_fit(" ".join(filler.split()[:words]), fits),
    }
    reference = None if answer is None else first_fitting([sample.reference, *hints.forms(sample, STUB, answer)], fits)
    if reference is None:  # no right answer known, or none fits: only the content-free adversaries
        return {name: out.get(name) for name in ADVERSARIES}, 0
    wrong = hints.wrong(sample, answer, candidates)
    enumeration, listed = _enumeration(sample, hints, answer, candidates, fits) if len(candidates) > 1 else (None, 0)
    repeated = longest_fitting(lambda n: " ".join([answer] * n), REPEATS, fits, least=2)
    out.update(
        enumerate=enumeration,
        repeat=repeated[1] if repeated else None,
        right_answer_bare=first_fitting([answer], fits),
        wrong_answer=first_fitting(hints.forms(sample, STUB, wrong), fits),
        reference=reference,
    )
    return {name: out[name] for name in ADVERSARIES}, listed


def adversarial_completions(sample: Sample, hints: AuditHints, words: int = 120,
                            fits: Callable[[str], bool] = lambda text: True,
                            candidates: list[str] | None = None) -> dict[str, str | None]:
    """Each adversary's completion for `sample` (None: it cannot be written, e.g. no right answer known, or it does
    not fit). The yardstick is the recipe's reference response when it `fits` the length limit, else the form with
    the answer. `candidates`: the row's answer space (`answer_space`; default: the recipe's candidates alone)."""
    answer = hints.answer(sample)
    if candidates is None:
        candidates = [] if answer is None else list(itertools.islice(hints.candidates(sample, answer), MAX_LISTED))
    return build_adversaries(sample, hints, answer, candidates, words=words, fits=fits)[0]


TOTAL = "total"  # the run's reward: the weighted sum of its components
DEGENERATE = ("empty", "whitespace", "format_only", "echo", "enumerate", "padding")


@dataclass
class Finding:
    component: str
    adversary: str
    mean: float
    reference: float
    kind: str = "as much as a right answer"
    culprits: tuple[str, ...] = ()  # a finding on the total: the components that pay the adversary more

    def line(self) -> str:
        if self.kind == "cannot tell right from wrong":
            return (f"reward {self.component!r} cannot tell right from wrong: it pays the reference answer "
                    f"{self.reference:.3g}, no more than {self.adversary} ({self.mean:.3g})")
        if self.kind == "more than a wrong answer":
            than = "a guess among the listed answers" if self.adversary == "enumerate" else "a wrong answer"
            return (f"reward {self.component!r} pays {self.adversary} ({ADVERSARIES[self.adversary]}) {self.mean:.3g}, "
                    f"more than {than} ({self.reference:.3g})")
        if self.kind == "ignores the answer":
            return (f"reward {self.component!r} ignores the answer: on every audited row it pays each adversary the "
                    f"same (reference, wrong_answer, empty ...: {self.mean:.3g} on average)")
        if self.kind == "raises":
            return f"reward {self.component!r} raises on {self.adversary} ({ADVERSARIES[self.adversary]}) completions"
        return (f"reward {self.component!r} pays {self.adversary} ({ADVERSARIES[self.adversary]}) {self.mean:.3g}, as "
                f"much as a right answer ({self.reference:.3g})")

    def allowed_by(self, allow: Sequence[str]) -> bool:
        """`allow` names a component, an adversary, or component:adversary (a finding on the total: every component
        that pays the adversary more)."""
        allow = set(allow)
        if self.component == TOTAL and self.culprits and self.adversary not in allow:
            return all({c, f"{c}:{self.adversary}"} & allow for c in self.culprits)
        return bool({self.component, self.adversary, f"{self.component}:{self.adversary}"} & allow)


@dataclass
class AuditReport:
    components: list[str]
    samples: int
    means: dict[tuple[str, str], float] = field(default_factory=dict)  # (adversary, component) -> mean score
    above_wrong: dict[tuple[str, str], float] = field(default_factory=dict)  # share scored above wrong_answer's
    errors: dict[str, int] = field(default_factory=dict)  # reward -> adversarial completions it raised on
    raised: dict[str, list[str]] = field(default_factory=dict)  # reward -> adversaries it raised on
    totals: dict[str, list[float]] = field(default_factory=dict)  # adversary -> the total of each row
    per_row: dict[tuple[str, str], list[float]] = field(default_factory=dict)  # (adversary, component) -> rows
    candidates: list[int] = field(default_factory=list)  # each row's number of allowed answers (0: unknown)
    findings: list[Finding] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)  # adversary -> its completion for the first sample
    notes: list[str] = field(default_factory=list)
    accepted: dict[str, str] = field(default_factory=dict)  # the recipe's known exploits, with its reasons

    def flags(self, allow: Sequence[str] = ()) -> list[Finding]:
        """The findings neither the recipe accepts nor `allow` names."""
        return [f for f in self.findings if not f.allowed_by([*allow, *self.accepted])]

    def accepted_lines(self, allow: Sequence[str] = ()) -> list[str]:
        lines = []
        for f in self.findings:
            reason = next((self.accepted[k] for k in (f"{f.component}:{f.adversary}", f.component, f.adversary)
                           if k in self.accepted), None)
            if reason is not None:
                lines.append(f"{f.line()}: accepted by the recipe ({reason})")
            elif f.allowed_by(allow):
                lines.append(f"{f.line()}: allowed (--allow)")
        return lines

    def table(self) -> str:
        width = max(12, *(len(c) + 2 for c in self.components))
        head = f"{'adversary':<18}" + "".join(f"{c:>{width}}" for c in self.components)
        lines = [f"reward audit: {self.samples} samples; each cell: mean score (share scored above a wrong answer's)",
                 head]
        flagged = {(f.adversary, f.component) for f in self.findings}
        for adversary in ADVERSARIES:
            cells = []
            for c in self.components:
                mean = self.means.get((adversary, c), math.nan)
                share = self.above_wrong.get((adversary, c), math.nan)
                cell = "-" if math.isnan(mean) else f"{mean:.2f} ({share:.0%})" if not math.isnan(share) else f"{mean:.2f}"
                cells.append(f"{cell + (' !' if (adversary, c) in flagged else ''):>{width}}")
            lines.append(f"{adversary:<18}" + "".join(cells))
        return "\n".join(lines)

    def to_dict(self, allow: Sequence[str] = ()) -> dict[str, Any]:
        return {"samples": self.samples, "components": self.components,
                "flags": [f.line() for f in self.flags(allow)], "accepted": self.accepted_lines(allow),
                "means": {f"{a}/{c}": v for (a, c), v in self.means.items()}, "errors": self.errors,
                "notes": self.notes}


def completion_tokens(tokenizer, eos_id: int | None, limit: int) -> CompletionCut:
    """text -> (text as a run would hold it, token ids): cut at `limit` tokens, else ended by end-of-sequence; it
    reads no more of a text than `limit` tokens can hold (audit_bounds.CompletionCut)."""
    return CompletionCut(tokenizer, eos_id, limit)


def _mean(values: list[float]) -> float:
    present = [v for v in values if not math.isnan(v)]
    return sum(present) / len(present) if present else math.nan


def audit_rewards(rewards: list[Reward], samples: Sequence[Sample], hints: AuditHints | None = None, *,
                  encode: Callable[[str], tuple[str, list[int]]] | None = None, padding_words: int = 120,
                  max_steps: int = 0, timeout: float | None = None) -> AuditReport:
    """Score every adversary of every sample with `rewards`; flags per the module's rules. `encode` (from
    `completion_tokens`) gives the completion token ids rewards may read and the budget every adversary is built
    to fit; without it they get none. `timeout`: seconds each reward call may take (the run's reward_timeout), as in
    training. Its cost is bounded whatever the rows hold: at most MAX_AUDIT_ROWS samples (the first), and of each
    text (question, answer, reference, field) no more characters than the budget can hold (audit_bounds.py)."""
    hints = hints or DEFAULT_HINTS
    fits, max_chars = text_fits(encode)
    dropped = max(0, len(samples) - MAX_AUDIT_ROWS)
    samples = [samples[k] for k in range(len(samples) - dropped)]
    read = [clipped_sample(s, max_chars) for s in samples]  # what the adversaries are built from
    answers, too_long = zip(*(bounded_answer(hints.answer, s, max_chars) for s in samples)) if samples else ((), ())
    space = answer_space(read, hints, answers)
    built = [build_adversaries(s, hints, a, c, words=padding_words, fits=fits, max_chars=max_chars)
             for s, a, c in zip(read, answers, space)]
    texts = [t for t, _ in built]
    report = AuditReport([r.name for r in rewards], len(samples), accepted=dict(hints.accepted))
    report.candidates = [listed for _, listed in built]
    report.examples = {name: text for name, text in texts[0].items() if text is not None} if texts else {}
    scores: dict[str, dict[str, list[float]]] = {}
    for adversary in ADVERSARIES:
        rows = [k for k, t in enumerate(texts) if t[adversary] is not None]
        scores[adversary] = {c: [math.nan] * len(samples) for c in report.components}
        if not rows:
            continue
        chosen = [samples[k] for k in rows]
        encoded = [encode(texts[k][adversary]) if encode else (texts[k][adversary], None) for k in rows]
        inputs = RewardInputs(
            completions=[t for t, _ in encoded], fields=collect_fields(chosen, 1),
            prompts=[reward_prompt(s) for s in chosen],
            completion_ids=[ids for _, ids in encoded] if encode else None,
            conversational=[isinstance(s.data_prompt, list) for s in chosen], state=trainer_state(0, max_steps),
        )
        raised: dict[str, int] = {}
        total, components = score(rewards, inputs, on_error="zero", errors=raised, timeout=timeout,
                                  warn_unscored=False)
        for name, count in raised.items():
            report.errors[name] = report.errors.get(name, 0) + count
            report.raised.setdefault(name, []).append(adversary)
        report.totals[adversary] = [math.nan] * len(samples)
        for k, v in zip(rows, total.tolist()):
            report.totals[adversary][k] = v
        for c, values in components.items():
            for k, v in zip(rows, values.tolist()):
                scores[adversary][c][k] = v
    for adversary, by_component in scores.items():
        for c, values in by_component.items():
            report.per_row[(adversary, c)] = values
            report.means[(adversary, c)] = _mean(values)
            wrong = scores["wrong_answer"][c]
            pairs = [(v, w) for v, w in zip(values, wrong) if not (math.isnan(v) or math.isnan(w))]
            report.above_wrong[(adversary, c)] = sum(v > w for v, w in pairs) / len(pairs) if pairs else math.nan
    report.findings = _findings(report)
    unread = [k for k, (a, long) in enumerate(zip(answers, too_long)) if a is None and not long]
    unfit = [k for k, t in enumerate(texts) if t["reference"] is None and k not in unread]
    if unread:
        report.notes.append("some samples have no right answer the audit can read (recipe audit hints, or a "
                            "solution/answer column): only content-free adversaries were scored on them")
    if unfit:
        budget = f"the {encode.limit}-token completion budget" if isinstance(encode, CompletionCut) else \
            f"{max_chars} characters"
        report.notes.append(f"rows {', '.join(map(str, unfit))}: no right answer in the recipe's form fits {budget}; "
                            "only content-free adversaries were scored on them (raise generation.max_new_tokens)")
    if dropped:
        report.notes.append(f"{dropped} further samples were not scored: the audit scores at most {MAX_AUDIT_ROWS}")
    return report


def _behaviour(report: AuditReport) -> list[Finding]:
    """Findings from the reward's own behaviour, whatever it pays the reference."""
    found = []
    totals = report.totals
    right, wrong = _mean(totals.get("reference", [])), _mean(totals.get("wrong_answer", []))
    if not (math.isnan(right) or math.isnan(wrong)) and right <= wrong + 1e-6:
        found.append(Finding(TOTAL, "wrong_answer", wrong, right, "cannot tell right from wrong",
                             tuple(report.components)))
    if not math.isnan(wrong):
        for adversary in DEGENERATE:
            values = totals.get(adversary, [])
            if adversary == "enumerate":  # listing K answers is worth a guess among them, no more
                pairs = [(v, w + (r - w) / k) for v, w, r, k in zip(values, totals["wrong_answer"], totals["reference"],
                                                                    report.candidates) if k > 1 and not math.isnan(v)]
                mean, bar = _mean([v for v, _ in pairs]), _mean([b for _, b in pairs])
            else:
                mean, bar = _mean(values), wrong
            if not (math.isnan(mean) or math.isnan(bar)) and mean > bar + 1e-6:
                culprits = tuple(c for c in report.components if report.means[(adversary, c)] > report.means[
                    ("wrong_answer", c)] + 1e-6) or tuple(report.components)
                found.append(Finding(TOTAL, adversary, mean, bar, "more than a wrong answer", culprits))
    for c in report.components:
        rows = [[report.per_row[(a, c)][k] for a in ADVERSARIES] for k in range(report.samples)]
        rows = [[v for v in row if not math.isnan(v)] for row in rows]
        judged = [row for row in rows if len(row) > len(CONTENT_FREE_NAMES)]  # the answer adversaries were scored
        if judged and all(max(row) - min(row) <= 1e-9 for row in judged) and not report.raised.get(c):
            found.append(Finding(c, "reference", _mean([row[0] for row in judged]), math.nan, "ignores the answer"))
    for c, adversaries in report.raised.items():
        for adversary in adversaries:
            found.append(Finding(c, adversary, math.nan, math.nan, "raises"))
    return found


CONTENT_FREE_NAMES = [name for name, kind in ADVERSARIES.items() if kind == CONTENT_FREE]


def _findings(report: AuditReport) -> list[Finding]:
    found = _behaviour(report)
    for c in report.components:
        right = report.means[("reference", c)]
        if math.isnan(right) or right <= 0:  # pays nothing for a right answer (a penalty): nothing to game
            continue
        sensitive = right - report.means[("wrong_answer", c)] > 1e-6 if not math.isnan(
            report.means[("wrong_answer", c)]) else True
        for adversary, kind in ADVERSARIES.items():
            judged = kind == CONTENT_FREE or (kind == WRONG_IN_FORM and sensitive) or (
                kind == RIGHT_OUT_OF_FORM and not sensitive)
            mean = report.means[(adversary, c)]
            if judged and not math.isnan(mean) and mean >= right - TOLERANCE * abs(right):
                found.append(Finding(c, adversary, mean, right))
    return found
