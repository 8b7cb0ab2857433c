"""The rollout modes: how many rows start, which continuations are kept, when rows branch.

Each mode drives an `EpisodeRunner` with one sampler call per step (all active rows of all
queries together) and returns the finished rows per query, plus a trace of its decisions (for
tests and debugging):

* `independent`: n rows per query, sampled on their own (GRPO-style groups).
* `tree`: PORTool's Algorithm 1 (spec §4.1). Depth 1: n first steps per query. Each later
  depth: every active node proposes f candidates; exactly n − n_c of the query's candidates
  (n_c = finished rows) are chosen uniformly at random without replacement; the rest, and the
  nodes left without a chosen child, are dropped. A node's first chosen child continues its
  environment; further children get a replayed copy.
* `arpo`: ARPO's entropy-based adaptive rollout (Dong et al. 2025; dongguanting/ARPO
  `verl_arpo_entropy/verl/workers/rollout/vllm_rollout/vllm_rollout_with_tools.py`): M rows
  start per query; after each round, each active row (its tool response appended) tries
  `beam_size − 1` copies with `selection.branch_count` on ΔH = H(step just sampled) − H(row's
  first own step), within the budget of N rows per query; a query with no active row and fewer
  than N rows restarts one row from its prompt per round, as the public code does.
"""

from __future__ import annotations

import itertools
from collections import defaultdict

import numpy as np

from tirjax.episodes import selection
from tirjax.episodes.episode import ACTIVE, Episode, EpisodeRunner

_SEED_RANGE = 2**31 - 1


def _seed(rng: np.random.Generator) -> int:
  return int(rng.integers(_SEED_RANGE))


def _query_rng(runner: EpisodeRunner, round_seed: int, q: int) -> np.random.Generator:
  """Query q's own random choices in a round: seeded by the round's draw and the query's
  batch-wide index, so that a share of a step's queries (one process's) makes the choices the
  whole batch makes. The shared Generator gives one draw per round, whatever the queries."""
  return np.random.default_rng([round_seed, runner.first_query + q])


def _first_steps(runner: EpisodeRunner, n: int, rng, top_logprobs: int = 0):
  """One call with the prompts of all queries, n samples each: n rows per query."""
  roots = [runner.root(q) for q in range(len(runner.tasks))]
  per_query = runner.sample(roots, n, _seed(rng), top_logprobs)
  rows = defaultdict(list)
  for q, cands in enumerate(per_query):
    for cand in cands:
      rows[q].append((runner.start(q), cand))
  return rows


def independent(runner: EpisodeRunner, rng: np.random.Generator):
  """n independent rows per query. Returns ({query: [Episode]}, trace)."""
  n = runner.options.n
  rows = {q: [] for q in range(len(runner.tasks))}
  for q, pairs in _first_steps(runner, n, rng).items():
    for ep, cand in pairs:
      rows[q].append(runner.extend(ep, cand))
  while True:
    active = [ep for eps in rows.values() for ep in eps if ep.status == ACTIVE]
    if not active:
      return rows, []
    for ep, (cand,) in zip(active, runner.sample(active, 1, _seed(rng))):
      runner.extend(ep, cand)


def tree(runner: EpisodeRunner, rng: np.random.Generator):
  """PORTool's rollout tree. Returns ({query: [Episode]}, trace); the trace has one entry per
  (depth, query): candidates as (uid, parent node uid), chosen uids, n_c."""
  n, f = runner.options.n, runner.options.tree.branch_factor
  rows = {q: [] for q in range(len(runner.tasks))}
  trace = []
  for q, pairs in _first_steps(runner, n, rng).items():
    trace.append(dict(depth=0, query=q, finished=0,
                      candidates=[(c.uid, None) for _, c in pairs],
                      chosen=[c.uid for _, c in pairs]))
    for ep, cand in pairs:
      rows[q].append(runner.extend(ep, cand))
  depth = 0
  while True:
    active = [ep for eps in rows.values() for ep in eps if ep.status == ACTIVE]
    if not active:
      return rows, trace
    depth += 1
    round_seed = _seed(rng)
    cands = dict(zip(map(id, active), runner.sample(active, f, round_seed)))
    for q in range(len(runner.tasks)):
      act = [ep for ep in rows[q] if ep.status == ACTIVE]
      if not act:
        continue
      done = [ep for ep in rows[q] if ep.status != ACTIVE]
      flat = [c for ep in act for c in cands[id(ep)]]
      chosen = [flat[i] for i in selection.tree_select(len(flat), n - len(done),
                                                       _query_rng(runner, round_seed, q))]
      trace.append(dict(depth=depth, query=q, finished=len(done),
                        candidates=[(c.uid, c.parent.steps[-1].uid) for c in flat],
                        chosen=[c.uid for c in chosen]))
      by_parent = defaultdict(list)
      for c in chosen:
        by_parent[id(c.parent)].append(c)
      children = []
      for ep in act:
        mine = by_parent.get(id(ep), [])
        if not mine:
          runner.drop(ep)  # a node without a chosen child: dropped, never trained on
          continue
        # Copies first: a fork replays the parent's path, which extending it would change.
        eps = [ep] + [runner.fork(ep) for _ in mine[1:]]
        children += [runner.extend(e, c) for e, c in zip(eps, mine)]
      rows[q] = done + children


def arpo(runner: EpisodeRunner, rng: np.random.Generator):
  """ARPO's adaptive rollout. Returns ({query: [Episode]}, trace); the trace has one entry per
  (round, query): the branch sources as (eid, ΔH, copies) and the restarts."""
  opts = runner.options.arpo
  k = opts.top_logprobs
  rows = {q: [] for q in range(len(runner.tasks))}
  trace = []

  def run(ep: Episode, cand) -> Episode:
    s = cand.sample
    h = selection.step_entropy(s.entropies, s.top_logprobs, len(s.tokens), opts.entropy_tokens,
                               runner.vocab_size)
    if ep.entropy_ref is None:
      ep.entropy_ref = h
    return runner.extend(ep, cand, entropy=h)

  for q, pairs in _first_steps(runner, opts.initial_rollouts, rng, k).items():
    rows[q] += [run(ep, cand) for ep, cand in pairs]
  for round_ in itertools.count():
    round_seed = _seed(rng)
    for q in range(len(runner.tasks)):
      act = [ep for ep in rows[q] if ep.status == ACTIVE]
      entry = dict(round=round_, query=q, sources=[], restarts=0)
      if act:
        deltas = [ep.steps[-1].entropy - ep.entropy_ref for ep in act]
        copies = selection.arpo_branches(deltas, opts.total_rollouts - len(rows[q]), opts,
                                         _query_rng(runner, round_seed, q))
        for ep, d, c in zip(act, deltas, copies):
          entry["sources"].append((ep.eid, d, c))
          rows[q] += [runner.fork(ep) for _ in range(c)]
      elif len(rows[q]) < opts.total_rollouts:
        rows[q].append(runner.start(q))
        entry["restarts"] = 1
      trace.append(entry)
    active = [ep for eps in rows.values() for ep in eps if ep.status == ACTIVE]
    if not active:
      return rows, trace
    for ep, (cand,) in zip(active, runner.sample(active, 1, round_seed, k)):
      run(ep, cand)


MODES = {"independent": independent, "tree": tree, "arpo": arpo}
