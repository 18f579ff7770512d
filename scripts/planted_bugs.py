"""Planted bugs: each one line of the package changed, the tests that should catch it run, the failures recorded,
the line restored. A check that the suite can fail where it matters (issue 41).

    python scripts/planted_bugs.py [TREE]

TREE: a checkout to plant in (default: this one; a copy keeps your working tree untouched while it runs, e.g.
`git worktree add /tmp/plant HEAD`). The targets first run unchanged and must pass. Writes planted_bugs.json in
TREE: each bug with the tests that failed (an empty list: a bug nothing caught)."""
import json, subprocess, sys, pathlib, re
ROOT = pathlib.Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else pathlib.Path(__file__).resolve().parents[1]
PY = sys.executable
BUGS = [
 ("loss: PPO clip takes the max, not the min", "vlm_grpo/grpo/algorithm/losses/clipped.py",
  "loss = -torch.min(ratio * advantages, clipped * advantages)", "loss = -torch.max(ratio * advantages, clipped * advantages)",
  ["tests/grpo/test_loss_parity_trl.py", "tests/grpo/test_algorithm_references.py"]),
 ("advantages: group std not divided", "vlm_grpo/grpo/algorithm/advantages/group.py",
  "advantages = centered / (group_std.repeat_interleave(num_generations) + STD_EPSILON)", "advantages = centered",
  ["tests/grpo/test_advantages.py", "tests/grpo/test_algorithm_references.py"]),
 ("KL: k3 estimator loses its -1", "vlm_grpo/grpo/algorithm/losses/objective.py",
  "per_token_kl = torch.exp(ref_minus_pol) - ref_minus_pol - 1", "per_token_kl = torch.exp(ref_minus_pol) - ref_minus_pol",
  ["tests/grpo/test_loss_parity_trl.py"]),
 ("cache policy: auto trusts the cache whatever the probe says", "vlm_grpo/compat/cache_policy.py",
  "    return report.cache_ok", "    return True", ["tests/compat"]),
 ("freeze policy: every float parameter trains", "vlm_grpo/adapters/freeze.py",
  "param.requires_grad_(trainable)", "param.requires_grad_(True)", ["tests/grpo/test_optim.py", "tests/grpo/test_lora.py"]),
 ("resume: the optimizer state is not loaded", "vlm_grpo/grpo/checkpoint/store.py",
  '        optimizer.load_state_dict(read["optimizer.pt"])', "        pass",
  ["tests/grpo/test_trainer.py::test_resume_gives_the_same_run"]),
 ("data order: every process draws the same prompts", "vlm_grpo/grpo/data/order.py",
  "start = step * batch_size * num_processes + process_index * batch_size", "start = step * batch_size * num_processes",
  ["tests/grpo/test_multi_node.py", "tests/grpo/test_data_source.py"]),
 ("rewards: the weights are not applied", "vlm_grpo/grpo/algorithm/advantages/aggregation.py",
  "total = (values * w).nansum(dim=1)", "total = values.nansum(dim=1)",
  ["tests/grpo/test_reward_aggregation.py", "tests/grpo/test_trl_rewards.py"]),
 ("scoring: truncated completions keep their tokens in the loss", "vlm_grpo/grpo/parts/scoring.py",
  "loss_mask = loss_mask * (~ro.truncated).unsqueeze(1).to(loss_mask.dtype)", "loss_mask = loss_mask",
  ["tests/grpo/test_algorithms_train.py::test_mask_truncated_completions_drops_the_rows_trl_drops"]),
 ("resume policy: a section's declared policy is ignored", "vlm_grpo/grpo/setting_fields.py",
  'return f.metadata.get("resume") or getattr(type(owner), "RESUME", "refused")', 'return f.metadata.get("resume") or "refused"',
  ["tests/reliability/test_resume_rules.py"]),
 ("log-probs: taken at temperature 1, not the sampling temperature", "vlm_grpo/grpo/parts/token_scorer.py",
  "temperature=self.cfg.generation.temperature, with_entropy=with_entropy,", "temperature=1.0, with_entropy=with_entropy,",
  ["tests/grpo/test_trainer.py::test_logprobs_are_taken_at_the_sampling_temperature"]),
 ("data: TRL's shuffle_dataset=False ignored", "vlm_grpo/grpo/parts/training_data.py",
  "shuffle=data.shuffle)", "shuffle=True)", ["tests/api/test_trl_trainer_surface.py"]),
]
def run(targets):
    proc = subprocess.run([PY, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider", "--maxfail=30", "-n", "2", *targets],
                          cwd=ROOT, capture_output=True, text=True, timeout=1800,
                          env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)})
    return sorted(set(re.findall(r"^FAILED (\S+)", proc.stdout, re.M))), (proc.stdout.strip().splitlines() or [""])[-1]


every = sorted({t for *_, targets in BUGS for t in targets})
failed, summary = run(every)
print(json.dumps({"baseline": summary, "failed": failed}), flush=True)
assert not failed, "the targets fail on the unchanged code"
results = []
for name, rel, old, new, targets in BUGS:
    path = ROOT / rel
    text = path.read_text()
    assert text.count(old) == 1, (name, text.count(old))
    path.write_text(text.replace(old, new))
    try:
        proc = subprocess.run([PY, "-m", "pytest", "-q", "-rf", "-p", "no:cacheprovider",
                               "--maxfail=30", "-n", "2", *targets], cwd=ROOT, capture_output=True, text=True,
                              env={**__import__("os").environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}, timeout=1200)
        failed = sorted(set(re.findall(r"^FAILED (\S+)", proc.stdout, re.M)))
        summary = (proc.stdout.strip().splitlines() or [""])[-1]
    finally:
        path.write_text(text)
    results.append({"bug": name, "file": rel, "caught_by": failed, "summary": summary})
    print(json.dumps(results[-1]), flush=True)
json.dump(results, open(ROOT / "planted_bugs.json", "w"), indent=1)
