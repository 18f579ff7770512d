"""One self-contained HTML page per run (`vlm-grpo report RUN_DIR` -> RUN_DIR/report.html): what the policy answered
for which image, next to the curves.

The page holds everything it shows (images as data URIs, charts as inline SVG, a few lines of inline script for
the filters) and loads nothing from anywhere, so it opens offline
and can be mailed or archived as one file. It stays light by sampling what it shows: at most MAX_STEPS logged steps
(evenly spaced, the first and the last included), MAX_GROUPS prompts per step (flagged ones first, then those whose
completions disagree most), completions cut at COMPLETION_CHARS, images shrunk to THUMB_SIDE pixels and no more than
IMAGE_BUDGET bytes of them. Sections: curves (svg_charts.py); best and worst groups (mean reward over the run); completions by step,
grouped by prompt with the prompt's images, each completion's rewards and advantage, the flagged ones marked;
attention heatmaps found in the run directory; settings and versions.
"""

from __future__ import annotations

import base64
import html
import importlib.metadata
import io
import json
import math
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from PIL import Image

from vlm_grpo.grpo import safe_files
from vlm_grpo.grpo.run.outputs import write_output
from vlm_grpo.inspect.plots import RunData
from vlm_grpo.inspect.svg_charts import chart_svgs

REPORT = "report.html"
MAX_STEPS = 12
MAX_GROUPS = 4
BEST_WORST = 3
COMPLETION_CHARS = 700
PROMPT_CHARS = 1500
THUMB_SIDE = 256
IMAGE_BUDGET = 5_000_000  # bytes of inlined images; past it an image is named, not shown
ATTENTION_GLOBS = ("attention*.png", "attention/**/*.png")  # `vlm-grpo attention --out` pictures kept with the run
PACKAGES = ("vlm-grpo", "torch", "transformers", "accelerate", "peft", "trl", "datasets")


# ---------------------------------------------------------------- groups of completions
@dataclass
class Group:
    """One prompt's completions at one step."""

    step: int
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        values = [_num(r.get("reward")) for r in self.rows]
        values = [v for v in values if math.isfinite(v)]
        return sum(values) / len(values) if values else float("nan")

    @property
    def spread(self) -> float:
        values = [v for v in (_num(r.get("reward")) for r in self.rows) if math.isfinite(v)]
        return max(values) - min(values) if values else 0.0

    @property
    def flagged(self) -> bool:
        return any(r.get("flags") for r in self.rows)


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return float("nan")


def group_rows(rows: Iterable[dict[str, Any]]) -> list[Group]:
    """Completions grouped by prompt: one group per (step, process, prompt of the batch), in log order."""
    groups: dict[tuple, Group] = {}
    for r in rows:
        key = (int(r.get("step", 0)), r.get("process", 0), r.get("group", r.get("sample_index")), r.get("prompt"))
        groups.setdefault(key, Group(key[0])).rows.append(r)
    return list(groups.values())


def sampled_steps(steps: list[int], n: int = MAX_STEPS) -> list[int]:
    """At most `n` of the steps, evenly spaced, the first and the last included."""
    if len(steps) <= n:
        return steps
    return sorted({steps[round(k * (len(steps) - 1) / (n - 1))] for k in range(n)})


def shown_groups(groups: list[Group], per_step: int = MAX_GROUPS) -> list[Group]:
    by_step: dict[int, list[Group]] = {}
    for g in groups:
        by_step.setdefault(g.step, []).append(g)
    out = []
    for step in sampled_steps(sorted(by_step)):
        # flagged prompts first, then the ones whose completions disagree most (where GRPO learns)
        out += sorted(by_step[step], key=lambda g: (not g.flagged, -g.spread))[:per_step]
    return out


def best_and_worst(groups: list[Group], n: int = BEST_WORST) -> tuple[list[Group], list[Group]]:
    scored = sorted((g for g in groups if math.isfinite(g.mean_reward)), key=lambda g: -g.mean_reward)
    best = scored[:n]
    worst = [g for g in reversed(scored) if g not in best][:n]
    return best, worst


# ---------------------------------------------------------------- inlined pictures and charts
class Pictures:
    """Run-directory images as data URIs, shrunk, each encoded once, within the byte budget. Only the run's own files
    are read (safe_files.read_run_file: inside the run directory, through no link): a row naming `/home/...`, `../`
    or a symlinked picture is left out, and the report says which and why, so a report meant to be mailed carries
    no picture from elsewhere on the disk."""

    def __init__(self, run_dir: Path, budget: int = IMAGE_BUDGET):
        self.run_dir, self.budget, self.cache = run_dir, budget, {}
        self.skipped = 0
        self.refused: dict[str, str] = {}  # path as named -> why it was left out

    def uri(self, rel: str, side: int = THUMB_SIDE) -> str | None:
        rel = str(rel)
        if rel in self.cache:
            return self.cache[rel]
        uri = None
        try:
            data = safe_files.read_run_file(self.run_dir, rel) if self.budget > 0 else None
        except safe_files.OutsideRun as err:
            self.refused[rel] = str(err)
            data = None
        if data is not None:
            with Image.open(io.BytesIO(data)) as im:
                im = im.convert("RGB")
                im.thumbnail((side, side))
                buf = io.BytesIO()
                im.save(buf, format="PNG")
                if buf.tell() > 64_000:  # a photograph: JPEG is a fraction of the size
                    buf = io.BytesIO()
                    im.save(buf, format="JPEG", quality=85)
                    kind = "jpeg"
                else:
                    kind = "png"
            uri = f"data:image/{kind};base64,{base64.b64encode(buf.getvalue()).decode()}"
            self.budget -= len(uri)
        if uri is None:
            self.skipped += 1
        self.cache[rel] = uri
        return uri


# ---------------------------------------------------------------- html pieces
def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _cut(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _fmt(v: Any) -> str:
    x = _num(v)
    return "–" if not math.isfinite(x) else f"{x:+.3f}"


def _tail(prompt: str, n: int = 90) -> str:
    """The prompt's end, on one line: where the question usually is."""
    return " ⏎ ".join(prompt.strip().splitlines())[-n:]


def _group_html(g: Group, pictures: Pictures, components: list[str], tag: str = "") -> str:
    first = g.rows[0]
    pics = []
    for kind in ("images", "video_frames"):
        for rel in first.get(kind, []):
            uri = pictures.uri(rel)
            title = f"{'video frame' if kind == 'video_frames' else 'image'} {rel}"
            pics.append(f'<img class="prompt-image" src="{uri}" alt="{_e(title)}" title="{_e(title)}">' if uri
                        else f'<span class="no-image">{_e(rel)} (not inlined)</span>')
    pictures_html = "".join(pics) or '<span class="no-image">no image logged</span>'
    head = "".join(f"<th>{_e(c)}</th>" for c in components)
    body = []
    for r in g.rows:
        reward = _num(r.get("reward"))
        flags = r.get("flags") or []
        comps = "".join(f"<td>{_fmt((r.get('rewards') or {}).get(c))}</td>" for c in components)
        mark = "".join(f'<span class="flag">{_e(f)}</span>' for f in flags)
        body.append(
            f'<tr class="completion{" flagged" if flags else ""}" data-step="{g.step}" '
            f'data-reward="{reward if math.isfinite(reward) else -1e30}">'
            f'<td class="text">{mark}<pre>{_e(_cut(str(r.get("completion", "")), COMPLETION_CHARS))}</pre></td>'
            f"<td><b>{_fmt(reward)}</b></td>{comps}<td>{_fmt(r.get('advantage'))}</td></tr>")
    prompt = _cut(str(first.get("prompt", "")), PROMPT_CHARS)
    return (
        f'<div class="group{" has-flag" if g.flagged else ""}" data-step="{g.step}">'
        f'<div class="group-head">{tag}<b>step {g.step}</b> · sample {_e(first.get("sample_index"))} · '
        f"mean reward {_fmt(g.mean_reward)} · {len(g.rows)} completions</div>"
        f'<div class="group-body"><div class="pictures">{pictures_html}</div><div class="answers">'
        f"<details><summary>prompt: …{_e(_tail(prompt))}</summary><pre>{_e(prompt)}</pre></details>"
        f'<table><tr><th>completion</th><th>reward</th>{head}<th>advantage</th></tr>{"".join(body)}</table>'
        "</div></div></div>")


def _versions(run_dir: Path) -> list[tuple[str, str]]:
    out = [("python", platform.python_version())]
    for name in PACKAGES:
        try:
            out.append((name, importlib.metadata.version(name)))
        except importlib.metadata.PackageNotFoundError:
            pass
    for folder in [run_dir / "final", *sorted(run_dir.glob("checkpoint-*"), reverse=True)]:
        config = folder / "config.json"
        if config.is_file():
            try:
                saved = json.loads(safe_files.read_run_file(run_dir, config.relative_to(run_dir))).get(
                    "transformers_version")
            except (safe_files.OutsideRun, ValueError, AttributeError):
                continue
            if saved:
                out.append((f"transformers that saved {folder.name}/", saved))
            break
    return out


def _attention_images(run_dir: Path, pictures: Pictures) -> list[str]:
    found = sorted({p for pattern in ATTENTION_GLOBS for p in run_dir.glob(pattern) if os.path.lexists(p)
                    and not p.is_dir()})
    out = []
    for path in found:
        rel = str(path.relative_to(run_dir))
        uri = pictures.uri(rel, side=720)
        if uri:
            out.append(f'<figure><img class="attention-image" src="{uri}" alt="{_e(rel)}"><figcaption>{_e(rel)}'
                       "</figcaption></figure>")
    return out


STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#222;background:#fafafa}
header{padding:12px 20px;background:#1f3a5f;color:#fff}header h1{margin:0;font-size:20px}
.filters{position:sticky;top:0;z-index:2;background:#eef2f7;padding:8px 20px;border-bottom:1px solid #ccd;
display:flex;gap:18px;align-items:center;flex-wrap:wrap}
main{padding:0 20px 40px}h2{border-bottom:2px solid #1f3a5f;padding-bottom:2px;margin-top:28px}
.charts{display:flex;flex-wrap:wrap;gap:10px}.chart{background:#fff;border:1px solid #ddd;padding:4px;margin:0}
.chart-svg{width:340px;height:auto;display:block}
.group{background:#fff;border:1px solid #ddd;margin:10px 0;border-radius:4px}
.group.has-flag{border-color:#d62728}.group-head{background:#f0f0f0;padding:4px 8px}
.group-body{display:flex;gap:12px;padding:8px}.pictures{flex:0 0 auto;max-width:270px}
.prompt-image{width:200px;max-width:256px;display:block;margin-bottom:4px;image-rendering:pixelated;border:1px solid #ccc}
.answers{flex:1;min-width:0}table{border-collapse:collapse;width:100%}
td,th{border-bottom:1px solid #eee;padding:3px 6px;text-align:right;vertical-align:top;white-space:nowrap}
td.text,th:first-child{text-align:left;white-space:normal;width:60%}
pre{white-space:pre-wrap;word-break:break-word;margin:0;font:12px/1.35 ui-monospace,monospace}
tr.flagged{background:#fdecea}.flag{display:inline-block;background:#d62728;color:#fff;border-radius:3px;
padding:0 5px;margin:0 4px 2px 0;font-size:11px}.tag{background:#2ca02c;color:#fff;border-radius:3px;padding:0 5px;
margin-right:6px}.tag.worst{background:#d62728}.no-image{color:#888;font-style:italic}
.attention-image{max-width:720px;border:1px solid #ccc}.note{color:#666}
"""

SCRIPT = """
function applyFilter(){
  var step=document.getElementById('step-filter').value;
  var minReward=parseFloat(document.getElementById('reward-filter').value);
  var flaggedOnly=document.getElementById('flagged-filter').checked;
  var shown=0,total=0;
  document.querySelectorAll('.group').forEach(function(g){
    var any=false;
    g.querySelectorAll('tr.completion').forEach(function(r){
      total++;
      var ok=(step==='all'||r.dataset.step===step)&&parseFloat(r.dataset.reward)>=minReward
        &&(!flaggedOnly||r.classList.contains('flagged'));
      r.hidden=!ok;if(ok){any=true;shown++;}
    });
    g.hidden=!any;
  });
  document.getElementById('reward-value').textContent=minReward.toFixed(2);
  document.getElementById('shown-count').textContent=shown+' of '+total+' completions shown';
}
document.addEventListener('DOMContentLoaded',function(){
  ['step-filter','reward-filter','flagged-filter'].forEach(function(id){
    document.getElementById(id).addEventListener('input',applyFilter);
    document.getElementById(id).addEventListener('change',applyFilter);
  });
  applyFilter();
});
"""


def build_report(run_dir: str | Path) -> str:
    """The report page of a run directory (it needs metrics.jsonl; completions and pictures when logged)."""
    run_dir = Path(run_dir)
    data = RunData.load(run_dir)
    groups = group_rows(data.completions)
    pictures = Pictures(run_dir)
    components = list(dict.fromkeys(c for r in data.completions for c in (r.get("rewards") or {})))
    best, worst = best_and_worst(groups)
    shown = shown_groups(groups)

    rewards = [_num(r.get("reward")) for r in data.completions]
    rewards = [v for v in rewards if math.isfinite(v)] or [0.0]
    lo, hi = math.floor(min(rewards) * 100) / 100, math.ceil(max(rewards) * 100) / 100
    steps_listed = sorted({g.step for g in shown + best + worst})
    step_options = '<option value="all">all</option>' + "".join(f'<option value="{s}">{s}</option>' for s in steps_listed)
    flagged = sum(bool(r.get("flags")) for r in data.completions)
    flag_counts: dict[str, int] = {}
    for r in data.completions:
        for f in r.get("flags") or []:
            flag_counts[f] = flag_counts.get(f, 0) + 1

    steps = [int(m["step"]) for m in data.metrics if "step" in m and "stage" not in m]
    first_reward = next((m["reward"] for m in data.metrics if isinstance(m.get("reward"), (int, float))), None)
    last_reward = next((m["reward"] for m in reversed(data.metrics) if isinstance(m.get("reward"), (int, float))), None)
    summary = [f"{len(set(steps))} steps logged"]
    if first_reward is not None:
        summary.append(f"reward {first_reward:.3f} → {last_reward:.3f}")
    summary.append(f"{len(data.completions)} completions in {len(groups)} groups"
                   + (f", {flagged} flagged by a guard" if flagged else ""))

    parts = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        "<meta http-equiv='Content-Security-Policy' content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">",  # nothing may load from anywhere
        f"<title>vlm-grpo report: {_e(run_dir.resolve().name)}</title><style>{STYLE}</style></head><body>",
        f"<header><h1>vlm-grpo run: {_e(run_dir.resolve().name)}</h1><div>{_e(' · '.join(summary))}</div></header>",
        '<div class="filters"><label>step <select id="step-filter">' + step_options + "</select></label>",
        f'<label>reward ≥ <input id="reward-filter" type="range" min="{lo}" max="{hi}" step="0.01" value="{lo}"> '
        '<span id="reward-value"></span></label>',
        '<label><input id="flagged-filter" type="checkbox"> flagged only</label><span id="shown-count"></span></div>',
        "<main><h2 id='curves'>Curves</h2><div class='charts'>",
    ]
    svgs = chart_svgs(data)
    parts += [f'<figure class="chart" title="{_e(t)}">{svg}</figure>' for t, svg in svgs]
    parts.append("</div>" + ("" if svgs else "<p class='note'>no metric logged yet</p>"))
    if flag_counts:
        parts.append("<p>Flags raised: " + ", ".join(f'<span class="flag">{_e(k)}</span>× {v}'
                                                     for k, v in sorted(flag_counts.items())) + "</p>")

    parts.append("<h2 id='best-worst'>Best and worst groups</h2>")
    parts += [_group_html(g, pictures, components, '<span class="tag">best</span>') for g in best]
    parts += [_group_html(g, pictures, components, '<span class="tag worst">worst</span>') for g in worst]
    if not groups:
        parts.append("<p class='note'>no completions logged (logging.log_completions)</p>")

    n_steps = len({g.step for g in groups})
    parts.append(f"<h2 id='completions'>Completions by step</h2><p class='note'>{len(shown)} of {len(groups)} groups "
                 f"shown: at most {MAX_GROUPS} per step over {len({g.step for g in shown})} of {n_steps} steps.</p>")
    parts += [_group_html(g, pictures, components) for g in shown]

    parts.append("<h2 id='attention'>Attention heatmaps</h2>")
    attention = _attention_images(run_dir, pictures)
    parts += attention or ["<p class='note'>none recorded in the run directory (<code>vlm-grpo attention --out "
                           f"{_e(run_dir)}/attention.png</code> adds one).</p>"]
    if pictures.skipped:
        parts.append(f"<p class='note'>{pictures.skipped} images not inlined (missing, not the run's own file, or past "
                     "the size budget).</p>")
    if pictures.refused:
        parts.append("<p class='note'>Left out, not the run's own files:</p><ul class='note'>"
                     + "".join(f"<li>{_e(why)}</li>" for why in list(pictures.refused.values())[:20]) + "</ul>")

    try:
        settings = safe_files.read_run_file(run_dir, "config.yaml").decode("utf-8", "replace")
    except safe_files.OutsideRun as err:
        settings = f"config.yaml left out: {err}" if os.path.lexists(run_dir / "config.yaml") else "config.yaml not found"
    parts.append(f"<h2 id='settings'>Settings</h2><pre>{_e(settings)}</pre>")
    parts.append("<h2 id='versions'>Versions</h2><table>"
                 + "".join(f"<tr><td class='text'>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in _versions(run_dir))
                 + "</table>")
    parts.append(f"</main><script>{SCRIPT}</script></body></html>")
    return "".join(parts)


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """RUN_DIR/report.html, a run file (grpo/safe_files.py: never through a link, on the run's list); or `out`, a path
    the user names, written through a temporary file and one rename as well, what was there moved aside."""
    html = build_report(run_dir).encode("utf-8")
    if out:  # a file this program did not write there is moved aside, never overwritten (run/outputs.py)
        path, note = write_output(Path(out), html)
        if note:
            print(note)
        return path
    return safe_files.write_run_file(Path(run_dir), REPORT, html)
