"""Plain-Python references of the matching-based estimators (spec §3, §4.2, §4.3).

Written from the spec, independently of the kernels: per-row loops over dicts, scipy's
`linear_sum_assignment` per row for the exact matching, MatchTIR's sort-based greedy, and
POT's `sinkhorn_knopp` loop for optimal transport. Every function takes
`batch: dict[str, np.ndarray]` (the `Rollouts` fields, plus `calls.<field>` for the call
encodings) and options, and returns `dict(steps=[B, T], rows=[B])`.
"""

from __future__ import annotations

import collections
import math

import numpy as np
from scipy.optimize import linear_sum_assignment


# ---------------------------------------------------------------------------------------------
# Group statistics (spec §3)

def zscore_groups(values: dict, groups: dict, zscore=None) -> dict:
  """z-score of values[row] within each group (spec §3 conventions)."""
  z = _zopts(zscore)
  out = {}
  for members in groups.values():
    xs = [float(values[i]) for i in members]
    n = len(xs)
    if n == 0:
      continue
    mean = sum(xs) / n
    for i, x in zip(members, xs):
      if n == 1:
        out[i] = x if z["singleton"] == "raw" else 0.0
      elif max(xs) == min(xs):
        out[i] = 0.0
      elif z["scale"] == "none":
        out[i] = x - mean
      else:
        std = math.sqrt(sum((v - mean) ** 2 for v in xs) / max(n - z["ddof"], 1))
        out[i] = (x - mean) / (std + z["eps"])
  return out


def _zopts(zscore) -> dict:
  base = dict(ddof=1, scale="std", singleton="zero", eps=1e-6)
  if zscore is None:
    return base
  if isinstance(zscore, dict):
    return {**base, **zscore}
  return {k: getattr(zscore, k) for k in base}


def groups_of(batch) -> dict:
  groups = collections.defaultdict(list)
  for b in range(len(batch["group_id"])):
    if batch["row_valid"][b]:
      groups[int(batch["group_id"][b])].append(b)
  return dict(groups)


# ---------------------------------------------------------------------------------------------
# Calls and matchings of one row

def row_calls(batch, b) -> list:
  """The row's predicted calls (t, k), in turn then slot order."""
  cv = batch["call_valid"][b]
  return [(t, k) for t in range(cv.shape[0]) for k in range(cv.shape[1]) if cv[t, k]]


def row_gts(batch, b) -> list:
  return [c for c in range(batch["gt_valid"].shape[1]) if batch["gt_valid"][b, c]]


TIE_TOLERANCE = 1e-5  # two matchings whose weights differ by less are tied (spec §4.2)


def max_weight(w: np.ndarray) -> float:
  """The maximum weight of a matching of w (pairs of weight ≤ 0 count as unmatched)."""
  w = np.maximum(w.astype(np.float64), 0.0)
  if w.size == 0:
    return 0.0
  rows, cols = linear_sum_assignment(w, maximize=True)
  return float(w[rows, cols].sum())


def exact_matching(w: np.ndarray) -> list:
  """spec §4.2's maximum-weight matching [(i, j)] of w [P, C]: among the optimal matchings,
  each ground-truth call j in order takes the earliest predicted call i it can (unmatched
  last). By fixing: j takes the first i with w[i, j] > 0 such that w[i, j] plus the best
  matching of what is left still reaches the optimum (scipy solves every test)."""
  w = np.maximum(w.astype(np.float64), 0.0)
  best = max_weight(w)
  free_rows, out, gained = list(range(w.shape[0])), [], 0.0
  for j in range(w.shape[1]):
    rest = list(range(j + 1, w.shape[1]))
    for i in free_rows:
      if w[i, j] <= 0:
        continue
      others = [r for r in free_rows if r != i]
      if gained + w[i, j] + max_weight(w[np.ix_(others, rest)]) >= best - TIE_TOLERANCE:
        out.append((i, j))
        gained += w[i, j]
        free_rows = others
        break
  return out


def greedy_matching(w: np.ndarray, gt_first: bool = False) -> list:
  """MatchTIR's `hungarian_assignment`: stable sort of (score, i, j) by score, descending.

  MatchTIR lists the pairs predicted call first (row-major). `gt_first` lists them by
  ground-truth call first, spec §4.2's tie order (equal scores to the earliest ground-truth
  call, then the earliest predicted one); the tests show both orders give the same matching.
  """
  m, n = w.shape
  pairs = ([(float(w[i, j]), i, j) for j in range(n) for i in range(m)] if gt_first else
           [(float(w[i, j]), i, j) for i in range(m) for j in range(n)])
  pairs.sort(reverse=True, key=lambda p: p[0])
  used_i, used_j, out = set(), set(), []
  for score, i, j in pairs:
    if score > 0 and i not in used_i and j not in used_j:
      used_i.add(i)
      used_j.add(j)
      out.append((i, j))
  return out


MATCHINGS = {"hungarian": exact_matching, "greedy": greedy_matching}


def sinkhorn_knopp(a, b, S, reg, num_iter_max=1000, stop_thr=1e-9):
  """POT's `ot.sinkhorn(a, b, M=-S, reg)` (method "sinkhorn"), in float64."""
  K = np.exp(S / reg)
  u = np.ones(len(a)) / len(a)
  v = np.ones(len(b)) / len(b)
  Kp = K / a[:, None]
  for it in range(num_iter_max):
    v = b / (K.T @ u)
    u = 1.0 / (Kp @ v)
    if it % 10 == 0:
      err = np.linalg.norm(np.einsum("i,ij,j->j", u, K, v) - b)
      if err < stop_thr:
        break
  return u[:, None] * K * v[None, :]


def row_sim(batch, b, calls, gts) -> np.ndarray:
  sim = batch["call_sim"][b]
  return np.array([[sim[t, k, c] for c in gts] for (t, k) in calls], np.float64).reshape(
      len(calls), len(gts))


def matched_pairs(batch, b, method) -> dict:
  """{call (t, k): (gt c, similarity)} for the row's matched pairs."""
  calls, gts = row_calls(batch, b), row_gts(batch, b)
  w = row_sim(batch, b, calls, gts)
  return {calls[i]: (gts[j], float(w[i, j])) for i, j in MATCHINGS[method](w)}


def is_answer_step(batch, b, t) -> bool:
  return bool(batch["answered"][b]) and t == int(batch["num_steps"][b]) - 1


def _out(batch, steps: dict, rows: dict) -> dict:
  B, T = batch["step_valid"].shape
  s, r = np.zeros((B, T)), np.zeros(B)
  for (b, t), v in steps.items():
    s[b, t] = v
  for b, v in rows.items():
    r[b] = v
  return dict(steps=s, rows=r)


# ---------------------------------------------------------------------------------------------
# HiDiffTIR (spec §4.2)

def hidifftir(batch, alpha=0.7, lam=1.0, answer_turn="judge", success_rate="as_printed",
              trajectory_difficulty=True, turn_difficulty=True, matching="hungarian",
              zscore=None, extras=False):
  groups = groups_of(batch)
  rows = [b for m in groups.values() for b in m]
  group = {b: g for g, m in groups.items() for b in m}
  steps_of = {b: range(int(batch["num_steps"][b])) for b in rows}
  match = {b: matched_pairs(batch, b, matching) for b in rows}

  r = {}  # raw turn reward r_{b,t} (Eq. 3)
  for b in rows:
    for t in steps_of[b]:
      calls = [(t, k) for (tt, k) in row_calls(batch, b) if tt == t]
      if answer_turn == "judge" and is_answer_step(batch, b, t):
        r[b, t] = float(batch["answer_score"][b])
      elif calls:
        r[b, t] = sum(match[b][c][1] if c in match[b] else 0.0 for c in calls) / len(calls)
      else:
        r[b, t] = 0.0

  gt_r = {b: {c: 0.0 for c in row_gts(batch, b)} for b in rows}  # r^(b)(c*)
  gt_turn = {b: {} for b in rows}  # turn of the call matched to c*
  for b in rows:
    for (t, _), (c, s) in match[b].items():
      gt_r[b][c] = s
      gt_turn[b][c] = t
  rbar, count = {}, {}  # per group and gt call: mean reward, number of rows with reward > 0
  for g, members in groups.items():
    for c in row_gts(batch, members[0]):
      rbar[g, c] = sum(gt_r[k][c] for k in members) / len(members)
      count[g, c] = sum(1 for k in members if gt_r[k][c] > 0)

  def cstar(b, t):
    return [c for c, tt in gt_turn[b].items() if tt == t]

  d, rt = {}, {}
  for b in rows:
    for t in steps_of[b]:
      cs = cstar(b, t)
      d[b, t] = 1.0 - (sum(rbar[group[b], c] for c in cs) / len(cs) if cs else 0.0)
      rt[b, t] = d[b, t] * r[b, t]
  rnorm = {}
  for g, members in groups.items():
    for t in range(batch["step_valid"].shape[1]):
      have = [b for b in members if t in steps_of[b]]
      if not have:
        continue
      vals = [rt[b, t] for b in have]
      lo, hi = min(vals), max(vals)
      if hi - lo < 1e-6:
        rhat = [1.0 if v > 0 else 0.0 for v in vals]
      else:
        rhat = [(v - lo) / (hi - lo) for v in vals]
      mass, hat_mass = sum(vals), sum(rhat)
      for b, h in zip(have, rhat):
        rnorm[b, t] = h * mass / hat_mass if hat_mass > 0 else 0.0
  R = {b: sum((rnorm if trajectory_difficulty else r)[b, t] for t in steps_of[b]) for b in rows}
  A = zscore_groups(R, groups, zscore)

  steps = {}
  w_hat = {}
  for b in rows:
    size = len(groups[group[b]])
    w = {}
    for t in steps_of[b]:
      cs = cstar(b, t)
      if success_rate == "as_printed":
        s_c = [count[group[b], c] / (size + lam) + lam for c in cs]
      else:
        s_c = [(count[group[b], c] + lam) / (size + lam) for c in cs]
      s = min(s_c) if cs else 1.0
      w[t] = r[b, t] / math.sqrt(s) if A[b] > 0 else 1.0
    mean = sum(w.values()) / len(w) if w else 0.0
    for t in steps_of[b]:
      w_hat[b, t] = w[t] / mean if mean > 0 else 1.0
      steps[b, t] = A[b] * (alpha + (1 - alpha) * w_hat[b, t]) if turn_difficulty else A[b]
  out = _out(batch, steps, A)
  if extras:
    out.update(raw_reward=r, difficulty=d, reweighted=rt, normalized=rnorm, score=R,
               turn_weight=w_hat)
  return out


# ---------------------------------------------------------------------------------------------
# MatchTIR (spec §4.3)

def _matchtir(batch, call_reward: dict, discount, zscore):
  groups = groups_of(batch)
  rows = [b for m in groups.values() for b in m]
  r = {}
  for b in rows:
    for t in range(int(batch["num_steps"][b])):
      calls = [(t, k) for (tt, k) in row_calls(batch, b) if tt == t]
      if is_answer_step(batch, b, t):
        r[b, t] = float(batch["answer_score"][b])
      elif calls:
        r[b, t] = sum(call_reward[b].get(c, 0.0) for c in calls) / len(calls)
      else:
        r[b, t] = 0.0
  total = {b: sum(r[b, t] for t in range(int(batch["num_steps"][b]))) for b in rows}
  a_traj = zscore_groups(total, groups, zscore)
  ret = {}
  for b in rows:
    n = int(batch["num_steps"][b])
    for t in range(n):
      ret[b, t] = sum(discount ** (j - t) * r[b, j] for j in range(t, n))
  a_turn = {}
  for g, members in groups.items():
    for t in range(batch["step_valid"].shape[1]):
      have = [b for b in members if t < int(batch["num_steps"][b])]
      z = zscore_groups({b: ret[b, t] for b in have}, {0: have}, zscore)
      for b in have:
        a_turn[b, t] = z[b]
  steps = {(b, t): 0.5 * (a_traj[b] + a_turn[b, t]) for (b, t) in ret}
  return _out(batch, steps, a_traj)


def matchtir_km(batch, matching="hungarian", discount=0.9, zscore=None):
  rows = [b for m in groups_of(batch).values() for b in m]
  rewards = {b: {c: s for c, (_, s) in matched_pairs(batch, b, matching).items()} for b in rows}
  return _matchtir(batch, rewards, discount, zscore)


def matchtir_ot(batch, reg=0.1, discount=0.9, max_iter=1000, tol=None, zscore=None):
  """`tol` (the kernel's stopping rule) is accepted and ignored: POT's own rule applies."""
  rewards = {}
  for b in [b for m in groups_of(batch).values() for b in m]:
    calls, gts = row_calls(batch, b), row_gts(batch, b)
    rewards[b] = {}
    if calls and gts:
      S = row_sim(batch, b, calls, gts)
      plan = sinkhorn_knopp(np.full(len(calls), 1 / len(calls)), np.full(len(gts), 1 / len(gts)),
                            S, reg, num_iter_max=max_iter)
      rewards[b] = {c: float((plan[i] * S[i]).sum()) for i, c in enumerate(calls)}
  return _matchtir(batch, rewards, discount, zscore)


# ---------------------------------------------------------------------------------------------
# ToolRL and FTRL (spec §4.3)

def _checks_passed(format_reward: float) -> int:
  return int(round((format_reward / 0.25 + 1) * 5 / 2))


def _decoded_calls(batch, b):
  """Predicted and ground-truth calls as (name, {key: value}) from the encodings."""
  def call(name, keys, values):
    return int(name), {int(k): int(v) for k, v in zip(keys, values) if k >= 0}
  preds = [call(batch["calls.pred_name"][b, t, k], batch["calls.pred_keys"][b, t, k],
                batch["calls.pred_values"][b, t, k]) for (t, k) in row_calls(batch, b)]
  gts = [call(batch["calls.gt_name"][b, c], batch["calls.gt_keys"][b, c],
              batch["calls.gt_values"][b, c]) for c in row_gts(batch, b)]
  return preds, gts


def _multiset_jaccard(xs, ys) -> float:
  if sorted(xs) == sorted(ys):
    return 1.0
  cx, cy = collections.Counter(xs), collections.Counter(ys)
  inter = sum((cx & cy).values())
  return inter / (len(xs) + len(ys) - inter)


def toolrl_reward(batch, b, format_checks=3) -> float:
  preds, gts = _decoded_calls(batch, b)
  n = int(batch["num_steps"][b])
  fmt = float(n > 0 and all(_checks_passed(batch["format_reward"][b, t]) >= format_checks
                            for t in range(n)))
  if not gts:
    return fmt
  w = np.zeros((len(preds), len(gts)))
  for i, (pn, pa) in enumerate(preds):
    for j, (gn, ga) in enumerate(gts):
      if pn == gn:
        keys_p, keys_g = set(pa), set(ga)
        union = keys_p | keys_g
        jac = len(keys_p & keys_g) / len(union) if union else 1.0
        w[i, j] = jac + sum(1.0 for k, v in ga.items() if k in pa and pa[k] == v)
  r_max = _multiset_jaccard([p[0] for p in preds], [g[0] for g in gts])
  r_max += sum(w[i, j] for i, j in exact_matching(w))
  s_max = 1 + sum(1 + len(ga) for _, ga in gts)
  return fmt + 6 * r_max / s_max - 3


def toolrl(batch, format_checks=3, zscore=None):
  groups = groups_of(batch)
  reward = {b: toolrl_reward(batch, b, format_checks) for m in groups.values() for b in m}
  return _row_level(batch, reward, groups, zscore)


def ftrl_reward(batch, b) -> float:
  calls = row_calls(batch, b)
  if calls:
    solved = sum(1 for (t, k) in calls if batch["call_solves"][b, t, k])
    return 2 * solved / (len(calls) + 1)
  n = int(batch["num_steps"][b])
  expected = int(batch["num_expected"][b])
  if any(_checks_passed(batch["format_reward"][b, t]) == 2 for t in range(n)):
    return -0.3
  if not batch["answered"][b]:
    return -0.5
  if batch["outcome"][b] == 1:
    return 1 / (1 + expected)
  return 0.5 if expected == 0 else 0.0


def ftrl(batch, zscore=None):
  groups = groups_of(batch)
  reward = {b: ftrl_reward(batch, b) for m in groups.values() for b in m}
  return _row_level(batch, reward, groups, zscore)


def _row_level(batch, reward, groups, zscore):
  adv = zscore_groups(reward, groups, zscore)
  steps = {(b, t): adv[b] for b in adv for t in range(int(batch["num_steps"][b]))}
  return _out(batch, steps, adv)
