"""Evaluation: one greedy (or low-temperature) episode per eval task, PORTool's four axes plus
Solve-P/R/F1 where tasks carry expected answers and the environment's own metrics; optionally
n sampled episodes per task at the rollout temperature, for pass@k and the share of tasks with
mixed outcomes (the headroom RL has: it re-weights what the policy already samples)."""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional, Sequence

import numpy as np

from tirjax import distributed
from tirjax.env import environments, metrics
from tirjax.env.tools import Task
from tirjax.episodes import RolloutOptions, rollout
from tirjax.episodes.judging import Judge


def evaluate(sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
             judge: Optional[Judge] = None, temperature: float = 0.0, seed: int = 0,
             progress: Optional[Callable[[int], None]] = None,
             answer_in_tool_message: bool = False, samples: int = 0,
             subset: int = 0, environment: str = "") -> dict[str, float]:
  """Metrics named `eval/...` over `tasks`, in chunks of the configured batch rows;
  `progress(tasks done)` is called after each chunk. `environment` (a registered name; ""
  none): its own metrics are added (`Environment.episode_metrics`, and with samples its
  `failure_kind` shares); `answer_in_tool_message`: ToolHop's AC also accepts an answer
  contained in the tool response before it (FTRL's scorer).
  `samples` > 0 adds `evaluate_sampled`'s pass@k at the rollout temperature (`options`).
  `subset` > 0 adds `eval/subset/<axis>`, PORTool's four axes over the first `subset` tasks
  only (the tasks a run's evaluations between its first and last run on, `train.eval_subset`),
  so that every evaluation of a run has a point on one curve of the same tasks.

  In a multi-process run each process runs its block of the tasks (`distributed.task_block`)
  and every process gets the metrics of all of them; greedy episodes are the same however the
  tasks are split."""
  opts = dataclasses.replace(options, mode="independent", n=1, temperature=temperature,
                             greedy_baseline=False)
  chunk = opts.shapes.num_rows
  rng = np.random.default_rng(seed)
  first, last = distributed.task_block(len(tasks))
  episodes = []
  for start in range(first, last, chunk):
    stop = min(start + chunk, last)
    episodes += rollout(sampler, tokenizer, tasks[start:stop], opts, judge, rng,
                        first_query=start).episodes
    if progress is not None:
      progress(len(episodes))
  episodes = [e for part in distributed.allgather_objects(episodes) for e in part]
  summaries = [e.summary for e in episodes]
  out = _axes(episodes, opts.max_steps, "eval/")
  if subset:  # episodes are in task order (each process's block, in process order)
    out.update(_axes(episodes[:subset], opts.max_steps, "eval/subset/"))
  with_expected = [s for s in summaries if s.num_expected > 0]
  if with_expected:
    out.update({f"eval/{k}": v for k, v in metrics.solve_metrics(with_expected).items()})
  env = environments.get(environment) if environment else None
  if env is not None and env.episode_metrics is not None:
    out.update(env.episode_metrics(episodes, {t.task_id: t for t in tasks},
                                   answer_in_tool_message))
  if samples:
    out.update(evaluate_sampled(sampler, tokenizer, tasks, options, samples, judge, seed,
                                environment=environment))
  return out


def evaluate_run(exp, sampler, tokenizer, tasks: Sequence[Task], judge: Optional[Judge],
                 graphdef, params, *, samples: int = 0, subset: int = 0,
                 progress: Optional[Callable[[int], None]] = None) -> dict[str, float]:
  """`evaluate` as the run's options `exp` (a `resolve.Experiment`) say, then the metrics its
  environment adds of the policy itself (`Environment.eval_extras`: toolworld's preference for
  the stated directions, from the weights `graphdef`, `params`): what the trainer's
  evaluations and `experiments.evaluate` report."""
  out = evaluate(sampler, tokenizer, tasks, exp.rollout, judge, exp.sampler.eval_temperature,
                 seed=exp.seed, progress=progress,
                 answer_in_tool_message=exp.env.answer_in_tool_message, samples=samples,
                 subset=subset, environment=exp.env.name)
  extras = environments.get(exp.env.name).eval_extras
  if extras is not None:
    from flax import nnx  # noqa: PLC0415
    out.update(extras(nnx.merge(graphdef, params), tokenizer, tasks,
                      exp.rollout.answer_protocol))
  return out


def _axes(episodes: Sequence, step_cap: int, prefix: str) -> dict[str, float]:
  """PORTool's four axes (and the abstention rate and mean outcome) of `episodes`."""
  axes = metrics.portool_metrics([e.summary for e in episodes], [e.outcome for e in episodes],
                                 step_cap=step_cap)
  return {prefix + "accuracy": axes["accuracy"], prefix + "avg_steps": axes["avg_tool_steps"],
          prefix + "unanswerable_rate": axes["unanswerable_rate"],
          prefix + "format_reward": axes["avg_format_reward"],
          prefix + "abstain_rate": axes["abstain_rate"],
          prefix + "mean_outcome": float(np.mean([e.outcome for e in episodes]))}


PASS_KS = (1, 4, 16)


def pass_at_k(n: int, c: int, k: int) -> float:
  """The unbiased pass@k of a task with `c` correct of `n` samples (Chen et al. 2021, Eq. 1):

      pass@k = 1 − C(n − c, k) / C(n, k),   k ≤ n

  the chance that k of the n samples, drawn without replacement, hold a correct one."""
  if not 0 <= c <= n or not 1 <= k <= n:
    raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
  if n - c < k:
    return 1.0
  return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def sampled_metrics(correct: Sequence[Sequence[bool]], ks: Sequence[int] = PASS_KS
                    ) -> dict[str, float]:
  """pass@k for each k of `ks` up to the n samples per task and for k = n, averaged over
  tasks, and the shares of tasks whose samples are all wrong, mixed, or all right, from
  `correct[task][sample]`."""
  counts = [(len(c), int(sum(c))) for c in correct]
  n = {m for m, _ in counts}
  if len(n) != 1 or 0 in n:
    raise ValueError(f"correct: every task needs the same number (>= 1) of samples, got {n}")
  (n,) = n
  out = {f"eval/pass@{k}": float(np.mean([pass_at_k(n, c, k) for _, c in counts]))
         for k in sorted({*ks, n}) if k <= n}
  out["eval/sampled_all_wrong"] = float(np.mean([c == 0 for _, c in counts]))
  out["eval/sampled_mixed"] = float(np.mean([0 < c < n for _, c in counts]))
  out["eval/sampled_all_right"] = float(np.mean([c == n for _, c in counts]))
  return out


def evaluate_sampled(sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
                     samples: int, judge: Optional[Judge] = None, seed: int = 0,
                     progress: Optional[Callable[[int], None]] = None,
                     environment: str = "") -> dict[str, float]:
  """`samples` independent episodes per task at the rollout temperature (`options`), scored
  as pass@k (`sampled_metrics`) and the sampled accuracy `eval/sampled_accuracy` (the
  mean over every sample: pass@1's plug-in value); where `environment` registers
  `failure_kind` (toolworld) also `eval/failure/<kind>`, the share of samples that failed
  first by each kind. Batches hold as
  many whole tasks as the configured rows allow (one task's samples if they exceed them). Each
  process runs its block of the tasks; every batch starts the same round seeds and rows draw
  from streams keyed on their task's index, so neither the batching nor the split over
  processes changes a task's samples."""
  opts = dataclasses.replace(options, mode="independent", n=samples)
  per_call = max(1, opts.shapes.num_rows // samples)
  if per_call * samples > opts.shapes.num_rows:
    opts = dataclasses.replace(opts, shapes=dataclasses.replace(opts.shapes, num_rows=samples))
  first, last = distributed.task_block(len(tasks))
  env = environments.get(environment) if environment else None
  failure_kind = None if env is None else env.failure_kind
  by_id = {t.task_id: t for t in tasks}
  correct: list[list[bool]] = []
  kinds: list = []  # each sample's failure kind (None: right), where the environment names them
  for start in range(first, last, per_call):
    stop = min(start + per_call, last)
    batch = rollout(sampler, tokenizer, tasks[start:stop], opts, judge,
                    np.random.default_rng([seed, samples]), first_query=start)
    by_group: dict[int, list[bool]] = {}
    for e in batch.episodes:
      by_group.setdefault(e.group, []).append(e.verdict == "true")
      if failure_kind is not None:
        kinds.append(None if e.verdict == "true" else failure_kind(
            by_id[e.task_id], e.results, e.status == "answered", e.answer))
    correct += [by_group.get(q, []) for q in range(stop - start)]
    if progress is not None:
      progress(len(correct))
  correct = [c for part in distributed.allgather_objects(correct) for c in part]
  out = sampled_metrics(correct)
  if failure_kind is not None:
    out.update(env.failure_shares([k for part in distributed.allgather_objects(kinds)
                                   for k in part]))
  out["eval/sampled_accuracy"] = float(np.mean([np.mean(c) for c in correct]))
  out["eval/sampled_temperature"] = float(opts.temperature)
  return out
