"""Evaluating a policy checkpoint on an environment's tasks, as `experiments.evaluate` runs it.

    result = evaluate_policy(config, policy="runs/default", out="runs/default/eval_toolhop")

`evaluation` checks everything before any compute (the policy directory, the split, that the
results are new, the config resolved with shapes fitted to the tasks); `evaluate_policy` runs
the trainer's own evaluation (`evaluation.evaluate_run`) and writes `results.json` and
`results.md`. The metrics are listed in `experiments/evaluate.py`'s docstring.
"""

from __future__ import annotations

import os
import time
import types
from typing import Optional

from flax import nnx

from tirjax import rundir
from tirjax.env import environments
from tirjax.episodes import judging
from tirjax.models.hf_io import load_hf
from tirjax.reporting import benchmark
from tirjax.trainer import prepare, resolve, samplers
from tirjax.trainer.evaluation import evaluate_run
from tirjax.trainer.progress import METRIC_LABELS, Progress
from tirjax.trainer.tasks import TaskSource, load_tokenizer


SPLITS = ("eval", "train", "all")


def policy_directory(policy: str) -> str:
  """The HF checkpoint directory of `policy` (itself, or a run directory's `hf_export/`)."""
  if not os.path.isdir(policy):
    raise resolve.ConfigError(f"policy: {policy!r} is not a directory")
  if os.path.exists(os.path.join(policy, "config.json")) and any(
      f.endswith(".safetensors") for f in os.listdir(policy)):
    return policy
  export = os.path.join(policy, rundir.HF_EXPORT)
  if os.path.isdir(export):
    return export
  raise resolve.ConfigError(f"policy: {policy!r} is neither a Hugging Face checkpoint directory "
                   "(config.json and *.safetensors) nor a run directory with hf_export/ (a run "
                   "exports when it finishes, with train.export_final=True)")


def evaluation(config, policy: str, out: str, tasks: Optional[int] = None,
               split: str = "eval") -> tuple[resolve.Experiment, str]:
  """The checked options of the evaluation of `policy` on the first `tasks` (default
  `env.eval_tasks`) of `split`, its shapes fitted to those tasks (`prepare.experiment`), and
  the policy's checkpoint directory: everything `evaluate_policy` checks before any compute.
  Sets `config`'s policy (`model.hf_checkpoint`), `sft.steps` (0) and `env.eval_tasks`."""
  environment = environments.get(config.env.name)
  if environment.not_a_benchmark:
    raise resolve.ConfigError(f"env.name={config.env.name}: {environment.not_a_benchmark}")
  if split not in SPLITS:
    raise resolve.ConfigError(f"split: must be one of {SPLITS}, got {split!r}")
  if split == "all" and environment.draw is not None:
    raise resolve.ConfigError(f"split=all: {config.env.name} draws its tasks; evaluate its "
                              "eval or train split")
  path = os.path.join(out, "results.json")
  if os.path.exists(path):
    raise FileExistsError(f"out: {path} exists; choose another --out (results are never "
                          "overwritten)")
  checkpoint = policy_directory(policy)
  with config.unlocked():
    config.model.hf_checkpoint = checkpoint
    config.sft.steps = 0  # nothing is trained: the trainer's sections are only checked
    if tasks is not None:
      config.env.eval_tasks = tasks
  return prepare.experiment(config, {split: config.env.eval_tasks}), checkpoint


def evaluate_policy(config, policy: str, out: str, tasks: Optional[int] = None,
                    command: str = "", split: str = "eval") -> dict:
  """Evaluates `policy` as `config` says on the first `tasks` (default `env.eval_tasks`) of
  `split`; writes and returns the results."""
  exp, checkpoint = evaluation(config, policy, out, tasks, split)
  path = os.path.join(out, "results.json")
  info = benchmark.machine()
  start = time.perf_counter()
  tokenizer = load_tokenizer(checkpoint)
  source = TaskSource(exp.env, seed=exp.seed)
  sampler = None
  try:
    eval_tasks = source.tasks(split, exp.env.eval_tasks)
    judge = judging.make_judge(exp.judge)
    graphdef, params = nnx.split(load_hf(checkpoint))
    os.makedirs(out, exist_ok=True)
    state = types.SimpleNamespace(params=params, policy_version=0)
    sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                     out, checkpoint, exp.rollout)
    metrics = evaluate_run(exp, sampler, tokenizer, eval_tasks, judge, graphdef, params,
                           samples=exp.sampler.eval_samples,
                           progress=Progress().evaluation(len(eval_tasks)))
  finally:
    if sampler is not None:
      sampler.close()
    source.close()
  result = {"command": command or "tirjax.trainer.policy_eval.evaluate_policy", "policy": policy,
            "checkpoint": checkpoint, "env": exp.env.name, "split": split,
            "tasks": len(eval_tasks),
            "sampler": exp.sampler.kind, "temperature": exp.sampler.eval_temperature,
            "samples": exp.sampler.eval_samples, "sample_temperature": exp.rollout.temperature,
            "answer_protocol": exp.rollout.answer_protocol,
            "solve_scoring": exp.rollout.solve_scoring,
            "answer_in_tool_message": exp.env.answer_in_tool_message,
            "metrics": metrics, "seconds": round(time.perf_counter() - start, 1),
            "machine": info}
  benchmark.write_result(path, result)
  with open(os.path.join(out, "results.md"), "w") as f:
    f.write(markdown(result))
  return result


def markdown(result: dict) -> str:
  sampled = (f"; {result['samples']} samples per task at temperature "
             f"{result['sample_temperature']} (pass@k)" if result.get("samples") else "")
  lines = [f"# {result['env']}: {result['checkpoint']}\n",
           f"{result['tasks']} tasks, {result['sampler']} sampler at temperature "
           f"{result['temperature']}{sampled}, {result['answer_protocol']} protocol, "
           f"{result['seconds']} s.\n", "| metric | value |", "| --- | ---: |"]
  for label, key in METRIC_LABELS:
    if key in result["metrics"]:
      lines.append(f"| {label} | {result['metrics'][key]:.3f} |")
  for key, value in result["metrics"].items():
    if key.startswith("eval/bfcl/"):
      lines.append(f"| BFCL {key.split('/')[-1]} accuracy | {value:.3f} |")
    if key.startswith("eval/failure/"):
      lines.append(f"| samples failed first by {key.split('/')[-1]} | {value:.3f} |")
  return "\n".join(lines) + "\n"
