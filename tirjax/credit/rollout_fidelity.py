"""Credit fidelity measured on real rollouts (spec §4.5): a policy samples train queries as an
RL step does, once as independent groups and once as PORTool trees; every turn is labelled
from its task's ground truth (the environment's `turn_labels`) and every registered
estimator's advantages are measured against the labels (`tirjax.metrics.credit`), with
bootstrap CIs over queries. `experiments.studies.credit_fidelity` is its command line (the
docstring there says what is written); results: benchmarks/results/credit_fidelity.md.
"""

from __future__ import annotations

import dataclasses
import os
import time
import types

import numpy as np
import optax
from flax import nnx

from tirjax import advantages, sharding
from tirjax.advantages.critic import without_critics
from tirjax.env import environments
from tirjax.env.toolworld.failures import RIGHT, TURN_KINDS
from tirjax.episodes import judging, rollout
from tirjax.metrics import credit as fid
from tirjax.models.hf_io import load_hf
from tirjax.reporting import benchmark
from tirjax.trainer import prepare, resolve, samplers
from tirjax.trainer.policy_eval import policy_directory
from tirjax.trainer.tasks import TaskSource, load_tokenizer
from tirjax.train_steps import answer_probe
from tirjax.train_steps.step import placement


DEFAULT_CONFIG = "configs/hidifftir.py:model=tiny"
# Why the estimators that read a learned critic's values have no rows: a fresh value head on the
# warm start would measure an untrained critic, not the method (issue 53 asks for rows after a
# critic warm-up).
CRITIC_NOT_MEASURED = "reads a learned critic's values; its rows need a critic warm-up, not built yet"
KINDS = ("independent", "tree")


def own_kind(name: str) -> str:
  """The rollout kind an estimator trains on, of `KINDS`: "tree" where its registration's
  rollout mode is (PORTool, Tree-GRPO), "independent" otherwise (ARPO's branching too)."""
  return "tree" if advantages.get(name).rollout_mode == "tree" else "independent"


def sample_batches(exp, sampler, tokenizer, tasks, judge, kind: str, seed: int, probe=None,
                   params=None):
  """(rollouts, labels) per batch of `train.queries_per_step` tasks, in `kind` mode; with
  `probe` (an `AnswerProbe`) and the policy's `params`, IGPO's `answer_logprob` filled."""
  opts = dataclasses.replace(exp.rollout, mode=kind, greedy_baseline=True)  # remax's baseline
  per = exp.train.queries_per_step
  for i, start in enumerate(range(0, len(tasks), per)):
    chunk = tasks[start:start + per]
    batch = rollout(sampler, tokenizer, chunk, opts, judge, np.random.default_rng([seed, i]))
    by_id = {t.task_id: t for t in chunk}
    labels = fid.episode_labels(batch.episodes, by_id.get, batch.rollouts.num_rows,
                                exp.env.name)
    r = fid.with_turn_labels(batch.rollouts, labels)  # `oracle` reads them
    if probe is not None:  # `igpo` reads them
      answers = [None] * r.num_rows
      for rec in batch.episodes:
        answers[rec.row] = by_id[rec.task_id].answer
      prefix, gold = answer_probe.answer_ids(tokenizer, answers, exp.rollout.answer_protocol)
      r = r.replace(answer_logprob=probe(params, r, prefix, gold))
    yield r, labels


def by_label(turns: fid.TurnTable) -> dict:
  """Per label (right and each wrong kind): turns, mean advantage, shares < 0 and = 0."""
  out = {}
  for label in (RIGHT,) + TURN_KINDS:
    sel = turns.label == label
    if sel.any():
      a = turns.advantage[sel]
      out[label] = {"turns": int(sel.sum()), "mean_advantage": float(a.mean()),
                    "negative": float((a < 0).mean()), "zero": float((a == 0).mean())}
  return out


def batch_stats(rollouts_list, labels_list) -> dict:
  """What the rollouts hold: success rate, mixed and all-fail groups, turns per label."""
  outcomes, mixed, all_fail, labels = [], [], [], []
  for r, lab in zip(rollouts_list, labels_list):
    valid = np.asarray(r.row_valid, bool)
    group, outcome = np.asarray(r.group_id)[valid], np.asarray(r.outcome)[valid]
    outcomes.append(outcome)
    for g in np.unique(group):
      o = outcome[group == g]
      mixed.append(np.ptp(o) > 0)
      all_fail.append(not (o > 0).any())
    labels += [x for row in lab if row is not None for x in row]
  labels = np.asarray(labels)
  return {"rows": int(sum(len(o) for o in outcomes)), "groups": len(mixed),
          "success_rate": float(np.concatenate(outcomes).__gt__(0).mean()),
          "mixed_groups": float(np.mean(mixed)), "all_fail_groups": float(np.mean(all_fail)),
          "turns": int(labels.size),
          "turn_labels": {k: float((labels == k).mean()) for k in (RIGHT,) + TURN_KINDS}}


def checked_experiment(config, policy: str, queries: int, out: str
                       ) -> tuple[resolve.Experiment, str]:
  """What `measure` checks before any compute: the output is new, the policy a checkpoint, the
  config resolves on an environment with turn labels, its shapes fitted to the `queries` train tasks sampled.
  Returns the experiment and the checkpoint."""
  for ext in (".json", ".md", ".png"):
    if os.path.exists(out + ext):
      raise FileExistsError(f"out: {out + ext} exists; choose another --out (results are "
                            "never overwritten)")
  checkpoint = policy_directory(policy)
  with config.unlocked():
    config.model.hf_checkpoint = checkpoint
    config.sft.steps = 0
  exp = prepare.experiment(config, {"train": queries})
  if environments.get(exp.env.name).turn_labels is None:
    raise resolve.ConfigError(f"env.name={exp.env.name}: registers no turn labels (turns "
                              "labelled from ground-truth plans, as toolworld's)")
  return exp, checkpoint


def measure(config, policy: str, queries: int, out: str, resamples: int = 1000,
            command: str = "") -> dict:
  """Samples, labels and measures as the module docstring says; writes and returns it."""
  exp, checkpoint = checked_experiment(config, policy, queries, out)
  info, start = benchmark.machine(), time.perf_counter()
  tokenizer = load_tokenizer(checkpoint)
  source = TaskSource(exp.env, seed=exp.seed)
  sampler = None
  names = without_critics(advantages.names())  # no value model to give them values yet
  results = {kind: {} for kind in KINDS}
  stats = {}
  try:
    tasks = source.tasks("train", queries)
    judge = judging.make_judge(exp.judge)
    graphdef, params = nnx.split(load_hf(checkpoint))
    state = types.SimpleNamespace(params=params, policy_version=0)
    sampler = samplers.make_sampler(exp.sampler, exp.step.logprob_chunk_size, graphdef, state,
                                    os.path.dirname(out) or ".", checkpoint, exp.rollout)
    probe = None
    if any("answer_logprob" in advantages.get(n).needs for n in names):
      if not environments.get(exp.env.name).gold_answers:
        raise resolve.ConfigError(f"env.name={exp.env.name}: has no gold answers, which igpo's "
                                  "probes need")
      place = placement(params, optax.identity(), sharding.make_mesh(exp.sharding),
                        exp.sharding.rules)
      probe = answer_probe.AnswerProbe(graphdef, place, exp.step)
    for kind in KINDS:
      batches = list(sample_batches(exp, sampler, tokenizer, tasks, judge, kind, exp.seed,
                                    probe, params))
      stats[kind] = batch_stats(*zip(*batches))
      for name in names:
        est = advantages.get(name)
        tables = []
        for i, (r, labels) in enumerate(batches):
          table = fid.turn_table(r, np.asarray(est(r, est.make_options()).tokens), labels)
          tables.append(dataclasses.replace(table, query=table.query + i * r.num_rows))
        turns = fid.concat(tables)
        results[kind][name] = {"measures": fid.fidelity(turns),
                               "ci95": fid.bootstrap_ci(turns, resamples, seed=exp.seed),
                               "by_label": by_label(turns)}
  finally:
    if sampler is not None:
      sampler.close()
    source.close()
  result = {"command": command or "tirjax.credit.rollout_fidelity.measure", "policy": policy,
            "checkpoint": checkpoint, "queries": len(tasks),
            "queries_per_batch": exp.train.queries_per_step, "rows_per_query": exp.rollout.n,
            "temperature": exp.rollout.temperature,
            "tree_branching": exp.rollout.tree.branch_factor, "bootstrap_resamples": resamples,
            "own": {name: own_kind(name) for name in names},
            "not_measured": {name: CRITIC_NOT_MEASURED for name in advantages.names()
                             if name not in names},
            "rollouts": stats,
            "estimators": results, "seconds": round(time.perf_counter() - start, 1),
            "machine": info}
  benchmark.write_result(out + ".json", result)
  benchmark.write_markdown(out + ".md", markdown(result))
  figure(result, out + ".png")
  return result


def _fmt(measures: dict, ci: dict, key: str) -> str:
  v = measures.get(key)
  if v is None:
    return "–"
  lo_hi = ci.get(key)
  return f"{v:.3f} [{lo_hi[0]:.3f}, {lo_hi[1]:.3f}]" if lo_hi else f"{v:.3f}"


def markdown(result: dict) -> str:
  cpu = result["machine"].get("cpu_id", {})
  lines = ["# Credit fidelity on real rollouts (spec §4.5)\n",
           f"Policy `{result['checkpoint']}`; {result['queries']} train queries in batches of "
           f"{result['queries_per_batch']}, {result['rows_per_query']} rows each at T = "
           f"{result['temperature']} (trees: branching {result['tree_branching']}); 95% CIs "
           f"from {result['bootstrap_resamples']} bootstrap resamples of queries. Machine: "
           f"{result['machine'].get('cpu', '')} (family {cpu.get('family')}, model "
           f"{cpu.get('model')}), {result['machine'].get('cpus')} cores. "
           f"{result['seconds']} s.\n"]
  for kind, s in result["rollouts"].items():
    labels = ", ".join(f"{k} {v:.3f}" for k, v in s["turn_labels"].items() if v)
    lines.append(f"- {kind}: {s['rows']} rows, success {s['success_rate']:.3f}, mixed groups "
                 f"{s['mixed_groups']:.3f}, all-fail groups {s['all_fail_groups']:.3f}; "
                 f"{s['turns']} turns: {labels}")
  for name, why in sorted(result.get("not_measured", {}).items()):
    lines.append(f"- not measured: {name} ({why})")
  header = ("| estimator | rollouts | AUC | AUC within queries | AUC within all-fail queries "
            "| wrong → A<0 | collateral blame | free credit | no signal | no signal, all-fail "
            "groups |")
  for title, pick in (("On its own rollouts", lambda n: [result["own"][n]]),
                      ("On both rollout kinds", lambda n: list(KINDS))):
    lines += ["", f"## {title}\n", header, "|" + " --- |" * (len(fid.MEASURES) + 2)]
    for name in sorted(result["own"]):
      for kind in pick(name):
        e = result["estimators"][kind][name]
        lines.append(f"| {name} | {kind} | " + " | ".join(
            _fmt(e["measures"], e["ci95"], k) for k in fid.MEASURES) + " |")
  lines += ["", "## Mean advantage by turn label (own rollouts)\n",
            "| estimator | " + " | ".join((RIGHT,) + TURN_KINDS) + " |",
            "|" + " --- |" * (len(TURN_KINDS) + 2)]
  for name in sorted(result["own"]):
    e = result["estimators"][result["own"][name]][name]["by_label"]
    lines.append(f"| {name} | " + " | ".join(
        f"{e[k]['mean_advantage']:+.3f}" if k in e else "–" for k in (RIGHT,) + TURN_KINDS)
        + " |")
  return "\n".join(lines) + "\n"


def figure(result: dict, path: str) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
  names = sorted(result["own"], key=lambda n: -(result["estimators"][result["own"][n]][n]
                                                ["measures"]["auc_query"] or 0))
  fig, axes = plt.subplots(1, 3, figsize=(15, 0.32 * len(names) + 1.5), sharey=True)
  for ax, key, title in ((axes[0], "auc_query", "AUC of right vs wrong turns, within queries"),
                         (axes[1], "collateral_blame", "collateral blame"),
                         (axes[2], "no_signal_all_fail", "no signal in all-fail groups")):
    for y, name in enumerate(names):
      e = result["estimators"][result["own"][name]][name]
      v, ci = e["measures"][key], e["ci95"][key]
      if v is None:
        continue
      # A percentile interval need not hold its point estimate (a ratio over few queries):
      # the bar is drawn as the interval reaches, never a negative length.
      err = [[max(v - ci[0], 0.0)], [max(ci[1] - v, 0.0)]] if ci else None
      ax.errorbar(v, y, xerr=err, fmt="o", color="#1f77b4" if result["own"][name] ==
                  "independent" else "#d62728", capsize=3)
    ax.set_title(title)
    ax.grid(axis="x", alpha=0.3)
  axes[0].axvline(0.5, color="#9a9a9a", lw=1)
  axes[0].set_yticks(range(len(names)), [f"{n} ({result['own'][n]})" for n in names])
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)
