"""A run writes its own pages at its end, however it was started: a trainer built in Python writes report.html (and
its charts when asked) as the train command does; a page that cannot be written only warns."""

from __future__ import annotations

import logging

import pytest
from datasets import Dataset

from vlm_grpo import GRPOConfig, GRPOTrainer
from vlm_grpo.grpo.settings.sections import LoggingConfig
from vlm_grpo.inspect.run_pages import run_pages, write_run_plots, write_run_report


def length(completions, **kwargs):
    return [float(len(c)) for c in completions]


def test_a_trainer_built_in_python_writes_the_report_of_its_run(tmp_path):
    rows = Dataset.from_list([{"prompt": f"Count to {i}."} for i in range(2)])
    trainer = GRPOTrainer(model="tiny:causal_lm", reward_funcs=length, train_dataset=rows,
                          args=GRPOConfig(output_dir=str(tmp_path), max_steps=1, per_device_train_batch_size=2,
                                          num_generations=2, max_completion_length=2, disable_tqdm=True))
    trainer.train()
    assert (tmp_path / "report.html").is_file() and "<svg" in (tmp_path / "report.html").read_text()
    assert not (tmp_path / "plots").exists()  # logging.plot is off by default


@pytest.mark.parametrize("plot, report, writers", [
    (False, True, [write_run_report]), (True, True, [write_run_plots, write_run_report]),
    (True, False, [write_run_plots]), (False, False, []),
])
def test_the_logging_settings_choose_the_pages(plot, report, writers):
    assert run_pages(LoggingConfig(plot=plot, report=report)) == writers


@pytest.mark.parametrize("write", [write_run_report, write_run_plots])
def test_a_page_of_a_run_without_metrics_only_warns(write, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        write(tmp_path)  # nothing logged: the run's models are saved by now, so the end goes on
    assert "could not write the run's" in caplog.text and "metrics.jsonl" in caplog.text
