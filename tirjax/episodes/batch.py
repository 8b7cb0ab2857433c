"""One rollout stage: tasks and a sampler in, a `RolloutBatch` (padded `Rollouts` + records) out."""

from __future__ import annotations

import dataclasses
import time
from typing import Optional, Sequence

import numpy as np

from tirjax.env.tools import Task
from tirjax.episodes import assemble, modes
from tirjax.episodes.assemble import EpisodeRecord
from tirjax.episodes.episode import EpisodeRunner
from tirjax.episodes.judging import Judge, judge_all, rule_judge
from tirjax.episodes.options import RolloutOptions
from tirjax.rollouts import Rollouts
from tirjax.sampling.interface import Sampler


@dataclasses.dataclass
class RolloutBatch:
  rollouts: Rollouts
  episodes: list  # [EpisodeRecord], one per valid row, in row order
  trace: list  # the mode's decisions (see `modes`)
  stats: dict  # sampler calls, prompts, sampled tokens, seconds in sampler / env / judge


def rollout(sampler: Sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
            judge: Optional[Judge] = None,
            rng: Optional[np.random.Generator] = None, first_query: int = 0) -> RolloutBatch:
  """Runs `options.mode` over `tasks` (one group per task) and judges the finished rows.

  Args:
    sampler: any `Sampler` (the JAX sampler, vLLM, a test double).
    tokenizer: the policy's Hugging Face tokenizer (chat rendering and step decoding).
    tasks: one query each; group q of the batch answers `tasks[q]`.
    options: mode, sizes and shapes.
    judge: verdict of an answered row (default: the rule-based verifier).
    rng: the Generator of the mode's random choices and of the sampler seeds. Default:
      `numpy.random.default_rng(options.seed)`; a trainer passes one Generator across steps.
    first_query: the index of `tasks[0]` among the step's queries when this call samples a
      share of them (one process of several): rows draw their samples from streams named by
      that index (`EpisodeRunner`), so a share gives the rows the whole batch would.
  """
  if not tasks:
    raise ValueError("tasks: need at least one task")
  need = len(tasks) * options.rows_per_query
  if need > options.shapes.num_rows:
    raise ValueError(f"shapes.num_rows={options.shapes.num_rows} is too small for "
                     f"{len(tasks)} tasks × {options.rows_per_query} rows")
  rng = np.random.default_rng(options.seed) if rng is None else rng
  judge = rule_judge() if judge is None else judge
  t0 = time.perf_counter()
  runner = EpisodeRunner(sampler, tokenizer, tasks, options, first_query)
  by_query, trace = modes.MODES[options.mode](runner, rng)
  rows = [(q, ep) for q in range(len(tasks)) for ep in by_query[q]]
  t1 = time.perf_counter()
  # Dialogue tasks (BFCL multi-turn) are scored by their benchmark's checker at the episode's
  # end (`StepResult.success`), not by a judge of a final answer.
  judged = judge_all(judge, [None if tasks[q].dialogue is not None
                             else assemble.trajectory(tasks[q], ep) for q, ep in rows],
                     options.judge_workers)
  judged = [("true" if ep.steps and ep.steps[-1].result.success else "false", None)
            if tasks[q].dialogue is not None else verdict
            for (q, ep), verdict in zip(rows, judged)]
  stats = dict(runner.stats, judge_s=time.perf_counter() - t1, rollout_s=t1 - t0,
               rows=len(rows))
  verdicts = [v for v, _ in judged]
  greedy = None
  if options.greedy_baseline:
    t2 = time.perf_counter()
    greedy = greedy_outcomes(sampler, tokenizer, tasks, options, judge, first_query)
    stats["greedy_baseline_s"] = time.perf_counter() - t2
  batch = assemble.to_rollouts(rows, tasks, runner.prompts, verdicts, options.shapes, greedy,
                               strict_directions=options.strict_directions)
  records = []
  for b, ((q, ep), (verdict, judgement)) in enumerate(zip(rows, judged)):
    summary = assemble.summary(tasks[q], ep)
    records.append(EpisodeRecord(
        row=b, group=q, task_id=tasks[q].task_id, status=ep.status,
        texts=[n.text for n in ep.steps], results=[n.result for n in ep.steps],
        node_uids=[n.uid for n in ep.steps], answer=summary.answer, verdict=verdict,
        judgement=judgement, outcome=float(batch.outcome[b]), num_tokens=ep.length,
        summary=summary))
  return RolloutBatch(batch, records, trace, stats)


def greedy_outcomes(sampler: Sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
                    judge: Judge, first_query: int = 0) -> list[float]:
  """ReMax's baseline (Li et al. 2023, Algorithm 1): the R_out of one greedy episode per task
  (independent mode, n = 1, temperature 0), judged as the batch's rows are. The episodes are
  dropped: they never enter the batch or the loss. Greedy decoding draws no randomness, so
  its own Generator leaves the caller's stream (and the next selections) untouched."""
  opts = dataclasses.replace(options, mode="independent", n=1, temperature=0.0,
                             greedy_baseline=False)
  out = rollout(sampler, tokenizer, tasks, opts, judge, np.random.default_rng(0), first_query)
  return [rec.outcome for rec in sorted(out.episodes, key=lambda rec: rec.group)]
