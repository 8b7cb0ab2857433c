"""The data contract between sampling and the loss: `Rollouts` (spec §2).

Everything between the sampler and the policy loss is one frozen pytree of padded arrays.
Sizes are read from the array shapes, so they are static under `jax.jit` and one padded
shape compiles once:

  B  trajectories (rows)        T  max steps per row        K  max tool calls per step
  C  max ground-truth calls     L  max tokens per row       P  max parameters per call

Conventions that the spec leaves to the implementation, fixed here:

* `group_id` and `node_id` are batch-global segment ids: `0 <= group_id < B` and
  `0 <= node_id < B*T` (or -1 on padding steps), so that segment operations can use the
  static segment counts `B` and `B*T`. Padding rows still carry an in-range `group_id`.
* `call_valid` holds the calls that are *matched against ground truth*: calls of the
  terminal tool (`response_gen`) are never entered there (spec §4.2).
* `answered[b]` is True when the row's last step (`num_steps[b] - 1`) is the answering step
  (it called the terminal tool or emitted `<answer>`); truncated rows have False.
* `token_valid` marks real tokens (prompt, generated and tool-response tokens); each row is
  right-padded, so its real tokens are a prefix.
* Optional inputs of single estimators: `calls` (the call encodings from which `call_sim`
  is computed, needed by `toolrl`), `call_solves` / `num_expected` (FTRL's verified
  outputs, needed by `ftrl`), `greedy_outcome` (R_out of one greedy rollout of the row's
  query, ReMax's baseline, needed by `remax`; the greedy rows themselves are never in the
  batch, so never in the loss), `state_id` (anchor states, needed by `gigpo`) and
  `turn_label` (each step's ground-truth label, needed by `oracle`) and `answer_logprob`
  (the policy's log-probability of the gold answer before each step, needed by `igpo`).
  `ref_logprobs` is optional (needed when the KL weight > 0).
* `state_id[b, t]` names what step t of row b saw before it acted: the query and the tool
  calls and tool responses (or user turns) of the row's earlier steps, the policy's own text
  ignored (GiGPO's anchor state, spec §4.4). Steps of one group with the same history share
  an id, whatever their tree nodes; ids are batch-global like `node_id` (`0 <= state_id <
  B*T`, -1 on padding), and rows that share a node share its state. `state_ids` computes
  them from one key per step of what its calls and responses were.
* `turn_label[b, t]` is +1 when step t of row b is right and -1 when it is wrong, by the
  environment's ground-truth labels of its turns (spec §4.5, `Environment.turn_labels`; the
  trainer fills it on environments that label turns, `metrics.credit.with_turn_labels`), and 0
  on padding steps and on the steps of a row without labels. Rows that share a node share its
  label (one step, one decision). The `oracle` estimator (spec §4.4) reads it; nothing else
  does.
* `values[b, l]` is a critic's V(s) of the state before token l (the prefix tokens[b, :l]),
  as the value model reads it off the hidden state at l − 1 (verl's convention); written on
  every token, read at loss tokens only (`ppo`, `turn_ppo`; `tirjax/advantages/critic.py`).
  Rows that share a tree node share its prefix, so they share its values.
* `sum_pi_squared[b, i]` is Σ_v π(v | prefix)² of the behaviour policy's next-token
  distribution at generated token i (0 elsewhere), in [0, 1]: the Logit-Gradient Proxy that
  verl's optimal token baselines read (`optimal_token_baseline`, `tir_optimal_token_baseline`
  with `energy="sum_pi_squared"`, spec §4.4). Optional: the credit bench's chain rollouts fill
  it exactly from their policy table; the trainer's samplers do not compute it yet.
* `answer_logprob[b, t]` is the current policy's length-normalised log-probability of the
  task's gold answer, teacher-forced after the history *before* step t of row b (the prompt and
  steps 0..t-1 with their tool responses, then the answer template): (1/|a|) Σ_j log π(a_j |
  history, a_<j), so exp of it is IGPO's P(a | history) (spec §4.4). It is ≤ 0 on valid steps,
  0 on padding steps; rows that share a tree node share it (one history). Step t's information
  gain is exp(answer_logprob[b, t+1]) − exp(answer_logprob[b, t]); the last step's reward is
  the outcome, so the probe after the last step is never needed and [B, T] holds all of them.
  The trainer fills it for `igpo` only (`tirjax/train_steps/answer_probe.py`).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass(frozen=True)
class CallEncoding:
  """Host-encoded tool calls (spec §2): name id, parameter-name ids, value hashes.

  Predicted calls are `[B, T, K, ...]`, ground-truth calls `[B, C, ...]`. Ids are `>= 0`;
  `-1` marks padding (a missing call name, or a missing parameter slot).
  """

  pred_name: jax.Array  # [B, T, K] int32
  pred_keys: jax.Array  # [B, T, K, P] int32
  pred_values: jax.Array  # [B, T, K, P] int32 hash of the canonical JSON value
  gt_name: jax.Array  # [B, C] int32
  gt_keys: jax.Array  # [B, C, P] int32
  gt_values: jax.Array  # [B, C, P] int32


@flax.struct.dataclass(frozen=True)
class Rollouts:
  """A padded batch of multi-turn trajectories. See the module docstring for sizes."""

  group_id: jax.Array  # [B] int32
  row_valid: jax.Array  # [B] bool
  outcome: jax.Array  # [B] f32 in {+1, 0, -1}
  num_steps: jax.Array  # [B] int32
  answered: jax.Array  # [B] bool
  step_valid: jax.Array  # [B, T] bool
  node_id: jax.Array  # [B, T] int32
  format_reward: jax.Array  # [B, T] f32 in [-0.25, 0.25]
  call_valid: jax.Array  # [B, T, K] bool
  call_sim: jax.Array  # [B, T, K, C] f32 in [0, 1]
  gt_valid: jax.Array  # [B, C] bool
  answer_score: jax.Array  # [B] f32 in [0, 1]
  tokens: jax.Array  # [B, L] int32
  token_valid: jax.Array  # [B, L] bool
  loss_mask: jax.Array  # [B, L] bool
  token_step: jax.Array  # [B, L] int32, -1 on prompt / tool-response / padding tokens
  old_logprobs: jax.Array  # [B, L] f32
  policy_version: jax.Array  # [B] int32
  ref_logprobs: Optional[jax.Array] = None  # [B, L] f32
  calls: Optional[CallEncoding] = None
  call_solves: Optional[jax.Array] = None  # [B, T, K] bool (FTRL)
  num_expected: Optional[jax.Array] = None  # [B] int32 (FTRL)
  greedy_outcome: Optional[jax.Array] = None  # [B] f32 in {+1, 0, -1} (ReMax's baseline)
  state_id: Optional[jax.Array] = None  # [B, T] int32 anchor state of each step (GiGPO)
  turn_label: Optional[jax.Array] = None  # [B, T] int32 +1 right / -1 wrong / 0 none (oracle)
  values: Optional[jax.Array] = None  # [B, L] f32 critic's V(prefix before the token) (ppo)
  sum_pi_squared: Optional[jax.Array] = None  # [B, L] f32 Σ_v π(v)² per generated token (OTB)
  answer_logprob: Optional[jax.Array] = None  # [B, T] f32 log P(gold | history before t) (IGPO)

  # Static sizes, read from shapes (never pytree leaves).
  @property
  def num_rows(self) -> int:
    return self.group_id.shape[0]

  @property
  def max_steps(self) -> int:
    return self.step_valid.shape[1]

  @property
  def max_calls(self) -> int:
    return self.call_valid.shape[2]

  @property
  def max_gt_calls(self) -> int:
    return self.gt_valid.shape[1]

  @property
  def max_tokens(self) -> int:
    return self.tokens.shape[1]


@flax.struct.dataclass(frozen=True)
class Advantages:
  """What an estimator returns (spec §4), the other half of the contract. Shapes follow
  `Rollouts`."""

  tokens: jax.Array  # [B, L] f32, 0 outside loss_mask
  steps: jax.Array  # [B, T] f32, 0 on padding steps
  rows: jax.Array  # [B] f32 trajectory-level advantage
  row_reward: jax.Array  # [B] f32, the scalar reward that the trajectory level normalised
  row_mask: jax.Array  # [B] bool, rows that enter the loss (padding and filtered rows: False)
  extras: dict = dataclasses.field(default_factory=dict)  # estimator-specific intermediates


class RolloutsError(ValueError):
  """A batch breaks the `Rollouts` contract; the message names the field and the problem."""


_SPEC = {
    # field: (shape symbols, dtype kind, padding value)
    "group_id": ("B", "i", 0),
    "row_valid": ("B", "b", False),
    "outcome": ("B", "f", 0.0),
    "num_steps": ("B", "i", 0),
    "answered": ("B", "b", False),
    "step_valid": ("BT", "b", False),
    "node_id": ("BT", "i", -1),
    "format_reward": ("BT", "f", 0.0),
    "call_valid": ("BTK", "b", False),
    "call_sim": ("BTKC", "f", 0.0),
    "gt_valid": ("BC", "b", False),
    "answer_score": ("B", "f", 0.0),
    "tokens": ("BL", "i", 0),
    "token_valid": ("BL", "b", False),
    "loss_mask": ("BL", "b", False),
    "token_step": ("BL", "i", -1),
    "old_logprobs": ("BL", "f", 0.0),
    "policy_version": ("B", "i", 0),
    "ref_logprobs": ("BL", "f", 0.0),
    "call_solves": ("BTK", "b", False),
    "num_expected": ("B", "i", 0),
    "greedy_outcome": ("B", "f", 0.0),
    "state_id": ("BT", "i", -1),
    "turn_label": ("BT", "i", 0),
    "values": ("BL", "f", 0.0),
    "sum_pi_squared": ("BL", "f", 0.0),
    "answer_logprob": ("BT", "f", 0.0),
}
_DTYPES = {"i": np.int32, "b": np.bool_, "f": np.float32}
CALL_PAD = -1  # every `CallEncoding` field's padding value
OPTIONAL = ("ref_logprobs", "call_solves", "num_expected", "greedy_outcome", "state_id",
            "turn_label", "values", "sum_pi_squared", "answer_logprob")


_CALL_SPEC = {"pred_name": "BTK", "pred_keys": "BTKP", "pred_values": "BTKP", "gt_name": "BC",
              "gt_keys": "BCP", "gt_values": "BCP"}


def fill_value(name: str):
  """The padding value of field `name` (`calls.<field>` for the call encodings)."""
  return CALL_PAD if name.startswith("calls.") else _SPEC[name][2]


def field_axes(name: str) -> str:
  """The size symbols of field `name`'s axes, e.g. "BTK" (`calls.<field>` for the call
  encodings): the module docstring's B, T, K, C, L, P."""
  return _CALL_SPEC[name[len("calls."):]] if name.startswith("calls.") else _SPEC[name][0]


def empty_arrays(B: int, T: int, K: int, C: int, L: int, P: Optional[int] = None,
                 optional: tuple = ("call_solves", "num_expected")) -> dict[str, np.ndarray]:
  """Numpy arrays of every required field (and of `optional` ones; with `P`, the call
  encodings as `calls.<field>`), all padding: a builder writes its rows into them and hands
  them to `from_numpy`."""
  sizes = {"B": B, "T": T, "K": K, "C": C, "L": L, "P": P}
  out = {name: np.full(tuple(sizes[s] for s in symbols), fill, _DTYPES[kind])
         for name, (symbols, kind, fill) in _SPEC.items()
         if name not in OPTIONAL or name in optional}
  if P is not None:
    out.update({f"calls.{name}": np.full(tuple(sizes[s] for s in symbols), CALL_PAD, np.int32)
                for name, symbols in _CALL_SPEC.items()})
  return out


def call_encoding(arrays: dict) -> CallEncoding:
  """The `calls.<field>` arrays of `arrays` as a `CallEncoding` (jax arrays)."""
  return CallEncoding(**{k[len("calls."):]: jnp.asarray(v, jnp.int32) for k, v in arrays.items()
                         if k.startswith("calls.")})


def to_numpy(r: Rollouts) -> dict[str, np.ndarray]:
  """The batch's fields as numpy arrays, the call encodings under `calls.<field>`; absent
  optional fields are left out."""
  out = {}
  for f in dataclasses.fields(r):
    value = getattr(r, f.name)
    if value is None:
      continue
    if f.name == "calls":
      out.update({f"calls.{g.name}": np.asarray(getattr(value, g.name))
                  for g in dataclasses.fields(value)})
    else:
      out[f.name] = np.asarray(value)
  return out


def from_numpy(arrays: dict, check: bool = True) -> Rollouts:
  """The batch of `to_numpy`'s (or `empty_arrays`'s) layout, each field in the contract's
  dtype (int32, bool, float32); validated unless `check` is False."""
  has_calls = any(k.startswith("calls.") for k in arrays)
  fields = {k: jnp.asarray(v, _DTYPES[_SPEC[k][1]]) for k, v in arrays.items()
            if not k.startswith("calls.")}
  r = Rollouts(**fields, calls=call_encoding(arrays) if has_calls else None)
  return validate(r) if check else r


def take_rows(r, rows, num_rows: int) -> dict[str, np.ndarray]:
  """Rows `rows` of `r` (a `Rollouts`, or arrays in `to_numpy`'s layout), in that order, as
  the first rows of a `num_rows` batch, the rest padding; -1 in `rows` puts a padding row
  there. Numpy arrays in `to_numpy`'s layout, for the caller to renumber ids and then
  `from_numpy`."""
  arrays = to_numpy(r) if isinstance(r, Rollouts) else r
  rows = np.asarray(rows, np.int64)
  if len(rows) > num_rows:
    raise ValueError(f"take_rows: {len(rows)} rows do not fit num_rows={num_rows}")
  B = len(arrays["group_id"])
  if np.any((rows < -1) | (rows >= B)):
    raise ValueError(f"take_rows: rows must be -1 (padding) or in [0, {B}), got "
                     f"{rows[(rows < -1) | (rows >= B)].tolist()}")
  taken = np.flatnonzero(rows >= 0)
  out = {}
  for name, value in arrays.items():
    arr = np.full((num_rows,) + value.shape[1:], fill_value(name), value.dtype)
    arr[taken] = value[rows[taken]]
    out[name] = arr
  return out


def validate(r: Rollouts) -> Rollouts:
  """Checks every contract rule on the host; raises `RolloutsError` naming the field.

  Meant for batches entering the trainer or a test, not for use inside `jit`.
  """
  a = {name: (None if getattr(r, name) is None else np.asarray(getattr(r, name)))
       for name in _SPEC}
  if a["group_id"].ndim != 1:
    raise RolloutsError(f"group_id: expected shape [B], got {a['group_id'].shape}")
  if a["step_valid"].ndim != 2 or a["call_sim"].ndim != 4 or a["tokens"].ndim != 2:
    raise RolloutsError("step_valid / call_sim / tokens: wrong number of dimensions "
                        f"{a['step_valid'].shape} / {a['call_sim'].shape} / {a['tokens'].shape}")
  B = a["group_id"].shape[0]
  T = a["step_valid"].shape[1]
  _, _, K, C = a["call_sim"].shape
  L = a["tokens"].shape[1]
  sizes = {"B": B, "T": T, "K": K, "C": C, "L": L}
  for name, (symbols, kind, _) in _SPEC.items():
    x = a[name]
    if x is None:
      continue
    want = tuple(sizes[s] for s in symbols)
    if x.shape != want:
      raise RolloutsError(f"{name}: expected shape [{','.join(symbols)}]={want}, got {x.shape}")
    if x.dtype.kind != kind and not (kind == "i" and x.dtype.kind == "u"):
      raise RolloutsError(f"{name}: expected a {_KIND_NAMES[kind]} array, got dtype {x.dtype}")
    if kind == "f" and not np.all(np.isfinite(x)):
      raise RolloutsError(f"{name}: contains NaN or Inf")

  rv, sv = a["row_valid"], a["step_valid"]
  _check(np.all((a["group_id"] >= 0) & (a["group_id"] < B)), "group_id",
         f"values must lie in [0, B={B}) on every row, padding rows included")
  _check(np.all(np.isin(a["outcome"][rv], (-1.0, 0.0, 1.0))), "outcome",
         "valid rows must have outcome in {-1, 0, +1}")
  _check(np.all((a["num_steps"] >= 0) & (a["num_steps"] <= T)), "num_steps", f"must lie in [0, T={T}]")
  expect_sv = (np.arange(T)[None, :] < a["num_steps"][:, None]) & rv[:, None]
  _check(np.array_equal(sv, expect_sv), "step_valid",
         "must be True exactly on the first num_steps steps of valid rows")
  _check(not np.any(a["answered"] & ~rv), "answered", "must be False on padding rows")
  _check(not np.any(a["answered"] & (a["num_steps"] == 0)), "answered",
         "a row with no steps cannot have answered")
  _check(np.all(np.abs(a["format_reward"][sv]) <= 0.25 + 1e-6), "format_reward",
         "valid steps must have format_reward in [-0.25, 0.25]")
  _check(not np.any(a["call_valid"] & ~sv[:, :, None]), "call_valid", "calls on padding steps")
  sim = a["call_sim"]
  _check(np.all((sim >= 0) & (sim <= 1 + 1e-6)), "call_sim", "values must lie in [0, 1]")
  pair_valid = a["call_valid"][..., None] & a["gt_valid"][:, None, None, :]
  _check(not np.any((sim > 0) & ~pair_valid), "call_sim",
         "must be 0 where the predicted or the ground-truth call is padding")
  _check(not np.any(a["gt_valid"] & ~rv[:, None]), "gt_valid", "ground-truth calls on a padding row")
  _check(np.all((a["answer_score"] >= 0) & (a["answer_score"] <= 1)), "answer_score",
         "must lie in [0, 1]")
  _check_per_group(a, "gt_valid", "their ground-truth calls")
  _check_tree(a, B, T)
  if a["greedy_outcome"] is not None:
    _check_greedy(a)
  if a["state_id"] is not None:
    _check_states(a, B, T)
  if a["turn_label"] is not None:
    check_turn_labels(a)
  if a["sum_pi_squared"] is not None:
    _check(np.all((a["sum_pi_squared"] >= 0) & (a["sum_pi_squared"] <= 1 + 1e-6)),
           "sum_pi_squared", "values must lie in [0, 1] (a sum of squared probabilities)")
  if a["answer_logprob"] is not None:
    _check_answer_logprob(a)
  _check_tokens(a)
  if r.calls is not None:
    _check_calls(r.calls, B, T, K, C)
  if (r.call_solves is None) != (r.num_expected is None):
    raise RolloutsError("call_solves / num_expected: give both or neither")
  return r


_KIND_NAMES = {"i": "integer", "b": "bool", "f": "floating-point"}


def _check(ok, field: str, problem: str) -> None:
  if not ok:
    raise RolloutsError(f"{field}: {problem}")


def _check_per_group(a, name: str, what: str) -> None:
  """Rows of one group answer one query: they agree on `name` (its ground-truth calls, its
  greedy rollout's outcome)."""
  gid, rv, values = a["group_id"], a["row_valid"], a[name]
  for g in np.unique(gid[rv]):
    rows = np.flatnonzero(rv & (gid == g))
    if not np.all(values[rows] == values[rows[0]]):
      raise RolloutsError(f"{name}: rows {rows.tolist()} of group {g} disagree on {what}")


def _check_prefix_ids(a, name: str, B: int, T: int, why: str) -> None:
  """`name`, step ids like `node_id`: in range, -1 on padding, and one (group, depth, id of
  the previous step) per id: an id names one prefix of one query. `why` ends the message."""
  ids, sv, gid = a[name], a["step_valid"], a["group_id"]
  _check(np.all(ids[~sv] == -1), name, "must be -1 on padding steps")
  _check(np.all((ids[sv] >= 0) & (ids[sv] < B * T)), name,
         f"valid steps must have ids in [0, B*T={B * T})")
  prev = np.full_like(ids, -1)
  prev[:, 1:] = ids[:, :-1]
  seen: dict[int, tuple[int, int, int]] = {}
  for b, t in zip(*np.nonzero(sv)):
    key = (int(gid[b]), int(t), int(prev[b, t]))
    if seen.setdefault(int(ids[b, t]), key) != key:
      raise RolloutsError(
          f"{name}: id {ids[b, t]} appears with (group, depth, previous id) "
          f"{seen[int(ids[b, t])]} and {key} (row {b}, step {t}); {why}")


def _check_one_per_node(a, name: str, why: str) -> None:
  """The rows that share a node share its step: one value of `name` [B, T] per node."""
  nid, values = a["node_id"], a[name]
  seen: dict[int, float] = {}
  for b, t in zip(*np.nonzero(a["step_valid"])):
    if seen.setdefault(int(nid[b, t]), values[b, t].item()) != values[b, t].item():
      raise RolloutsError(f"{name}: node {nid[b, t]} has {seen[int(nid[b, t])]} on one row and "
                          f"{values[b, t]} on row {b} (step {t}); {why}")


def _check_tree(a, B: int, T: int) -> None:
  """node_id: one (group, depth, parent) per node; the rows that share a node share its step,
  hence its format_reward."""
  _check_prefix_ids(a, "node_id", B, T, "a shared node must share its group, depth and prefix")
  _check_one_per_node(a, "format_reward", "rows that share a node share its step")


def _check_greedy(a) -> None:
  """greedy_outcome: an R_out on valid rows, one per query (its greedy rollout's)."""
  _check(np.all(np.isin(a["greedy_outcome"][a["row_valid"]], (-1.0, 0.0, 1.0))),
         "greedy_outcome", "valid rows must have greedy_outcome in {-1, 0, +1}")
  _check_per_group(a, "greedy_outcome", "it (one greedy rollout per query)")


def _check_states(a, B: int, T: int) -> None:
  """state_id: one (group, depth, previous state) per id (a history extends the history
  before it), and one state per tree node (a shared node is one step)."""
  _check_prefix_ids(a, "state_id", B, T, "a state is one history")
  _check_one_per_node(a, "state_id", "rows that share a node share its state")


def _check_answer_logprob(a) -> None:
  """answer_logprob: a finite log-probability (≤ 0) on valid steps, 0 on padding steps, one
  value per tree node (rows that share a node share the history before it)."""
  lp, sv = a["answer_logprob"], a["step_valid"]
  _check(np.all(np.isfinite(lp)), "answer_logprob", "values must be finite")
  _check(np.all(lp[sv] <= 1e-6), "answer_logprob", "values must be ≤ 0 (log-probabilities)")
  _check(not np.any(lp[~sv]), "answer_logprob", "must be 0 on padding steps")
  _check_one_per_node(a, "answer_logprob", "rows that share a node share its history")


def check_turn_labels(a) -> None:
  """turn_label (`a`: numpy arrays of the batch's fields): +1 / -1 / 0 on valid steps, 0 on
  padding steps, and one label per tree node (rows that share a node share its step)."""
  label, sv = a["turn_label"], a["step_valid"]
  _check(np.all(np.isin(label, (-1, 0, 1))), "turn_label",
         "values must be +1 (right), -1 (wrong) or 0 (no label)")
  _check(not np.any(label[~sv]), "turn_label", "must be 0 on padding steps")
  _check_one_per_node(a, "turn_label", "rows that share a node share its step")


def state_ids(group_id, step_key, step_valid) -> np.ndarray:
  """`state_id` [B, T] int32 from one integer key per step of what the step's tool calls and
  responses were (equal keys: the same calls and responses; the policy's text left out).

  The state of step t is its group and the keys of steps 0..t-1 of its row (a prefix code per
  depth, so no loop over rows); ids are dense from 0 over valid steps, -1 on padding.
  """
  group_id, step_key = np.asarray(group_id, np.int64), np.asarray(step_key, np.int64)
  step_valid = np.asarray(step_valid, bool)
  B, T = step_valid.shape
  prefix, code = group_id.copy(), np.zeros((B, T), np.int64)
  for t in range(T):
    code[:, t] = t * B + prefix  # prefix codes are dense ids < B at each depth
    prefix = np.unique(np.stack([prefix, step_key[:, t]], 1), axis=0, return_inverse=True)[1]
    prefix = prefix.reshape(-1)
  out = np.full((B, T), -1, np.int32)
  out[step_valid] = np.unique(code[step_valid], return_inverse=True)[1].reshape(-1)
  return out


def _check_tokens(a) -> None:
  tv, lm, ts = a["token_valid"], a["loss_mask"], a["token_step"]
  length = tv.sum(axis=1)
  _check(np.array_equal(tv, np.arange(tv.shape[1])[None, :] < length[:, None]), "token_valid",
         "each row's real tokens must be a prefix (right padding)")
  _check(not np.any(lm & ~tv), "loss_mask", "set on padding tokens")
  _check(not np.any(tv & ~a["row_valid"][:, None]), "token_valid", "tokens on a padding row")
  _check(np.all(ts[~lm] == -1), "token_step", "must be -1 wherever loss_mask is False")
  ok_step = (ts[lm] >= 0) & (ts[lm] < np.broadcast_to(a["num_steps"][:, None], ts.shape)[lm])
  _check(np.all(ok_step), "token_step", "generated tokens must belong to a valid step of their row")


def _check_calls(c: CallEncoding, B: int, T: int, K: int, C: int) -> None:
  P = np.asarray(c.pred_keys).shape[-1]
  want = {"pred_name": (B, T, K), "pred_keys": (B, T, K, P), "pred_values": (B, T, K, P),
          "gt_name": (B, C), "gt_keys": (B, C, P), "gt_values": (B, C, P)}
  for name, shape in want.items():
    x = np.asarray(getattr(c, name))
    if x.shape != shape or x.dtype.kind not in "iu":
      raise RolloutsError(f"calls.{name}: expected an integer array of shape {shape}, "
                          f"got {x.dtype} {x.shape}")


def step_to_tokens(step_values: jax.Array, token_step: jax.Array) -> jax.Array:
  """Broadcasts per-step values [B, T] to tokens [B, L] through `token_step` (0 where -1)."""
  idx = jnp.clip(token_step, 0, step_values.shape[1] - 1)
  out = jnp.take_along_axis(step_values, idx, axis=1)
  return jnp.where(token_step >= 0, out, 0.0)


def write_tokens(arrays: dict, row: int, pos: int, tokens, logprobs=None, step: int = -1) -> int:
  """Writes `tokens` into row `row` of a batch's numpy arrays from position `pos`; returns the
  position after them. `step >= 0`: the policy's own tokens of step `step` (in the loss, with
  their `old_logprobs`); `step = -1`: prompt or tool-response tokens (outside the loss)."""
  n = len(tokens)
  if pos + n > arrays["tokens"].shape[1]:
    raise ValueError(f"shapes.max_tokens={arrays['tokens'].shape[1]} is too small: row {row} "
                     f"needs {pos + n} tokens")
  arrays["tokens"][row, pos:pos + n] = tokens
  arrays["token_valid"][row, pos:pos + n] = True
  if step >= 0:
    arrays["loss_mask"][row, pos:pos + n] = True
    arrays["token_step"][row, pos:pos + n] = step
    if logprobs is not None:
      arrays["old_logprobs"][row, pos:pos + n] = logprobs
  return pos + n
