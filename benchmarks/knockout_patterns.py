"""The knockout chains' floor, measured on drawn tasks (issue 51's credit testbed).

    PYTHONPATH=. python -m benchmarks.knockout_patterns --n=500 \
        --out=benchmarks/results/knockout_patterns

For K = 2 and K = 4, over the first `n` train tasks of stream 0 (`chain_family=knockout`,
`p_down=0`, as grid=credit_k<K> draws them), each task enumerated exactly
(`toolworld.patterns`, no sampling):
  * blind success: the success rate of a policy that takes each direction by a fair coin and
    everything else right (2^-K when every pattern gives another answer);
  * early-answer share: tasks where some result before the answer (of the right branch; of
    any branch) matches the answer (the rule judge);
  * the builder's rejections: worlds drawn and refused (`Unfit`, by reason) per task kept;
  * the shape of the plans: calls per task, steps per task, calls in the widest step;
  * the build time per task, on this machine (recorded with the result);
  * with `--tokenizer=DIR`: the token length of each task's confused demonstration (every
    direction a coin flip, `answer_tag`, the default imperfections: what the grids' SFT
    shows), the rows' `max_tokens` must hold the longest (configs/ablate.py).
Writes `<out>.json` and `<out>.md`.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics
import time

from absl import app, flags

from tirjax.env.toolworld import Difficulty, make_tasks
from tirjax.env.toolworld import patterns, queries
from tirjax.reporting import benchmark


def _counting(template, counts: collections.Counter):
  """`template` whose build counts its calls and its refusals (by reason)."""
  def build(rng, world):
    counts["built"] += 1
    try:
      return template.build(rng, world)
    except queries.Unfit as e:
      counts[f"unfit: {e}" if str(e) else "unfit: no room (cities)"] += 1
      raise
  return dataclasses.replace(template, build=build)


def _reason(key: str) -> str:
  """A refusal's reason without the pattern and index it names."""
  return "unfit: a result of some pattern equals the answer" if " of pattern " in key else key


def demo_lengths(tasks, tokenizer_dir: str) -> list[int]:
  import transformers  # pylint: disable=import-outside-toplevel
  from tirjax.env.toolworld import DemoOptions, build_tokenizer, demo_tokens, make_demos
  tok = transformers.AutoTokenizer.from_pretrained(str(build_tokenizer(tokenizer_dir)))
  demos = make_demos(tasks, seed=0, options=DemoOptions(p_confuse=1.0,
                                                        answer_protocol="answer_tag"))
  return [len(demo_tokens(tok, d)[0]) for d in demos]


def measure(k: int, n: int, tokenizer_dir: str = "") -> dict:
  name = f"knockout_cities_{k}"
  counts: collections.Counter = collections.Counter()
  original = queries.TEMPLATES[name]
  queries.TEMPLATES[name] = _counting(original, counts)
  try:
    start = time.perf_counter()
    tasks = make_tasks("train", n, seed=0, difficulty=Difficulty(
        chain_directions=k, chain_family="knockout", p_down=0.0))
    seconds = time.perf_counter() - start
  finally:
    queries.TEMPLATES[name] = original
  drawn = counts.pop("built")
  refused = collections.Counter()
  for key, v in counts.items():
    refused[_reason(key)] += v
  # (builds count the eval split's draws too: make_tasks draws the stream and keeps train's)
  blind = [patterns.blind_success(t) for t in tasks]
  early = [patterns.early_hits(t) > 0 for t in tasks]
  early_any = [patterns.early_hits(t, every_branch=True) > 0 for t in tasks]
  calls = collections.Counter(len(t.flat_gt_calls) for t in tasks)
  steps = collections.Counter(len(t.gt_calls) for t in tasks)
  widest = collections.Counter(max(len(s) for s in t.gt_calls) for t in tasks)
  out = {"k": k, "tasks": len(tasks), "two_to_minus_k": 2.0 ** -k,
          "blind_success_mean": statistics.fmean(blind),
          "blind_success_min": min(blind), "blind_success_max": max(blind),
          "early_answer_share": statistics.fmean(early),
          "early_answer_share_any_branch": statistics.fmean(early_any),
          "builds": drawn, "refused": sum(refused.values()),
          "refused_share": sum(refused.values()) / drawn,
          "refused_by_reason": dict(sorted(refused.items())),
          "calls_per_task": dict(sorted(calls.items())),
          "steps_per_task": dict(sorted(steps.items())),
          "calls_in_widest_step": dict(sorted(widest.items())),
          "build_seconds_per_task_drawn": seconds / drawn}
  if tokenizer_dir:
    lengths = demo_lengths(tasks, tokenizer_dir)
    out.update(demo_tokens_max=max(lengths), demo_tokens_mean=statistics.fmean(lengths))
  return out


def report(result: dict) -> str:
  lines = ["# Knockout chains: a direction-blind policy's success and early answers",
           "", "Written by `python -m benchmarks.knockout_patterns` (see its docstring); "
           f"machine: {result['machine']['cpu']}, {result['machine']['cpus_usable']} usable "
           f"cores, {result['note']}.", "",
           "| K | tasks | blind success (exact) | 2^-K | min / max per task | early-answer share "
           "| any branch | builds | refused share | calls per task | steps per task | "
           "widest step |", "|" + "---|" * 12]
  for r in result["by_k"]:
    lines.append(
        f"| {r['k']} | {r['tasks']} | {r['blind_success_mean']:.4f} | {r['two_to_minus_k']:.4f} "
        f"| {r['blind_success_min']:.4f} / {r['blind_success_max']:.4f} "
        f"| {r['early_answer_share']:.3f} | {r['early_answer_share_any_branch']:.3f} "
        f"| {r['builds']} | {r['refused_share']:.3f} | {r['calls_per_task']} "
        f"| {r['steps_per_task']} | {r['calls_in_widest_step']} |")
  if "demo_tokens_max" in result["by_k"][0]:
    lines += ["", "Confused demonstrations (answer_tag), tokens: " + "; ".join(
        f"K = {r['k']}: longest {r['demo_tokens_max']}, mean {r['demo_tokens_mean']:.1f}"
        for r in result["by_k"]) + "."]
  if result.get("before"):
    lines += ["", "Before this design: " + result["before"]]
  lines += ["", "Builds: every world drawn until the n-th train task (the tasks the split sends "
            "to eval included); refused share: of those, the worlds the builder refused "
            "(`Unfit`), by reason:", ""]
  for r in result["by_k"]:
    lines.append(f"- K = {r['k']}: {r['refused_by_reason']}")
  return "\n".join(lines) + "\n"


_N = flags.DEFINE_integer("n", 500, "train tasks of stream 0 per K")
_KS = flags.DEFINE_string("ks", "2,4", "the numbers of directions K, comma-separated")
_OUT = flags.DEFINE_string("out", "benchmarks/results/knockout_patterns",
                           "the result files' path, without .json / .md")
_NOTE = flags.DEFINE_string("note", "", "a note kept in the result")
_BEFORE = flags.DEFINE_string("before", "", "the design before, as measured (text)")
_TOKENIZER = flags.DEFINE_string("tokenizer", "", "a directory to build the tokenizer in")


def main(argv) -> None:
  del argv
  result = {"machine": benchmark.machine(jax_info=False), "note": _NOTE.value, "n": _N.value,
            "before": _BEFORE.value,
            "by_k": [measure(int(k), _N.value, _TOKENIZER.value) for k in _KS.value.split(",")]}
  with open(_OUT.value + ".json", "w") as f:
    json.dump(result, f, indent=1)
  with open(_OUT.value + ".md", "w") as f:
    f.write(report(result))
  print(report(result))


if __name__ == "__main__":
  app.run(main)
