"""Evaluation: one greedy (or low-temperature) episode per eval task, PORTool's four axes plus
Solve-P/R/F1 where tasks carry expected answers and ToolHop's answer correctness."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import numpy as np

from tirjax import distributed
from tirjax.env import metrics
from tirjax.env.tools import Task
from tirjax.episodes import RolloutOptions, rollout
from tirjax.episodes.judging import Judge


def evaluate(sampler, tokenizer, tasks: Sequence[Task], options: RolloutOptions,
             judge: Optional[Judge] = None, temperature: float = 0.0, seed: int = 0,
             progress: Optional[Callable[[int], None]] = None,
             answer_in_tool_message: bool = False) -> dict[str, float]:
  """Metrics named `eval/...` over `tasks`, in chunks of the configured batch rows;
  `progress(tasks done)` is called after each chunk. `answer_in_tool_message`: ToolHop's AC
  also accepts an answer contained in the tool response before it (FTRL's scorer).

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
  axes = metrics.portool_metrics(summaries, [e.outcome for e in episodes],
                                 step_cap=opts.max_steps)
  out = {"eval/accuracy": axes["accuracy"], "eval/avg_steps": axes["avg_tool_steps"],
         "eval/unanswerable_rate": axes["unanswerable_rate"],
         "eval/format_reward": axes["avg_format_reward"],
         "eval/mean_outcome": float(np.mean([e.outcome for e in episodes]))}
  with_expected = [s for s in summaries if s.num_expected > 0]
  if with_expected:
    out.update({f"eval/{k}": v for k, v in metrics.solve_metrics(with_expected).items()})
  by_id = {t.task_id: t for t in tasks}
  if all(by_id[e.task_id].metadata.get("dataset") == "toolhop" for e in episodes):
    out["eval/answer_correctness"] = metrics.query_mean(
        [e.task_id for e in episodes],
        [metrics.answer_correctness(
            e.answer, by_id[e.task_id].answer,
            _preceding_tool_message(e) if answer_in_tool_message else None) for e in episodes])
  if all(by_id[e.task_id].metadata.get("dataset") == "bfcl" for e in episodes):
    out.update(bfcl_accuracy(episodes, by_id))
  return out


def bfcl_accuracy(episodes, by_id) -> dict[str, float]:
  """BFCL multi-turn accuracy as bfcl-eval reports it: per category, the share of entries its
  checker accepts; `overall`, the unweighted mean over the categories evaluated (bfcl-eval's
  multi-turn summary)."""
  by_category: dict[str, list] = {}
  for e in episodes:
    by_category.setdefault(by_id[e.task_id].metadata["category"], []).append(e.verdict == "true")
  out = {f"eval/bfcl/{c}": float(np.mean(v)) for c, v in sorted(by_category.items())}
  out["eval/bfcl/overall"] = float(np.mean([np.mean(v) for v in by_category.values()]))
  return out


def _preceding_tool_message(episode) -> Optional[str]:
  """The tool response of the step before the answering one (None if the row answered first
  or did not answer)."""
  if episode.answer is None or len(episode.results) < 2:
    return None
  return episode.results[-2].response_content
