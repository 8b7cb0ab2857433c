"""Every registered estimator on degenerate inputs: never NaN or Inf (spec §3), zeros where
the spec says so, token advantages consistent with step advantages."""

import numpy as np
import pytest

from tirjax import advantages
from tirjax.testing.records import GroupRecord, RowRecord, StepRecord, build_rollouts

ADD = {"name": "add", "arguments": {"a": 1, "b": 2}}
MUL = {"name": "mul", "arguments": {"x": 3}}
ANSWER = {"name": "response_gen", "arguments": {"answer": "3"}}
# One padded shape for every case: each estimator compiles once in this file.
SHAPE = dict(num_rows=8, max_steps=3, max_calls=2, max_gt_calls=2, max_tokens=12, max_params=2)
# Token-level estimators whose advantages differ within a step (ppo's GAE: V differs per token).
TOKEN_LEVEL = ("ppo",)
# Estimators whose advantage is a group z-score (or deviation) of a per-row reward: those
# registered with `group_normalised=True`.
GROUP_NORMALISED = tuple(n for n in advantages.names() if advantages.get(n).group_normalised)


def step(*calls, node=None, fm=0.25):
  return StepRecord(calls=list(calls), node=node, format_reward=fm, tokens=(4, 5),
                    response_tokens=(6,), solves=[False] * len(
                        [c for c in calls if c["name"] != "response_gen"]))


def same_rows(n, outcome):
  return [RowRecord(outcome=outcome, steps=[step(ADD), step(ANSWER)]) for _ in range(n)]


CASES = {
    "all_equal_correct": [GroupRecord(gt_calls=[ADD], num_expected=1, rows=same_rows(4, 1))],
    "all_equal_wrong": [GroupRecord(gt_calls=[ADD, MUL], rows=same_rows(3, -1))],
    "singletons": [GroupRecord(gt_calls=[ADD], rows=same_rows(1, o)) for o in (1, 0, -1)],
    "no_steps": [GroupRecord(gt_calls=[ADD], rows=[RowRecord(outcome=-1, steps=[])] * 3)],
    "some_rows_without_steps": [GroupRecord(gt_calls=[MUL], rows=[
        RowRecord(outcome=-1, steps=[]), RowRecord(outcome=1, steps=[step(MUL), step(ANSWER)]),
        RowRecord(outcome=0, steps=[step()])])],
    "no_ground_truth_calls": [GroupRecord(gt_calls=[], rows=[
        RowRecord(outcome=1, steps=[step(ADD, MUL), step(ANSWER)]),
        RowRecord(outcome=-1, steps=[step(ADD)])])],
    "no_calls_at_all": [GroupRecord(gt_calls=[], rows=[
        RowRecord(outcome=o, steps=[step(fm=-0.25)]) for o in (1, -1)])],
    "single_chain_tree": [GroupRecord(gt_calls=[ADD], rows=[
        RowRecord(outcome=1, steps=[step(ADD, node="a"), step(MUL, node="b"),
                                    step(ANSWER, node="c")])])],
    "shared_prefix_tree": [GroupRecord(gt_calls=[ADD], rows=[
        RowRecord(outcome=o, steps=[step(ADD, node="a"), step(MUL, node=f"b{i}")])
        for i, o in enumerate((1, 1, 1))])],
    "all_padding": [],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request):
  return request.param, build_rollouts(CASES[request.param], with_ftrl=True, with_ref=True,
                                       with_greedy=True, with_labels=True, with_values=True,
                                       with_answer_logprob=True, **SHAPE)


@pytest.mark.parametrize("name", advantages.names())
def test_finite_and_consistent(name, case):
  label, r = case
  out = advantages.get(name)(r)
  for field, x in [("tokens", out.tokens), ("steps", out.steps), ("rows", out.rows),
                   ("row_reward", out.row_reward), *out.extras.items()]:
    assert np.all(np.isfinite(np.asarray(x, float))), f"{name} / {label}: {field}"
  steps, tokens = np.asarray(out.steps), np.asarray(out.tokens)
  assert not np.any(steps[~np.asarray(r.step_valid)]), f"{name} / {label}: padding steps"
  assert not np.any(tokens[~np.asarray(r.loss_mask)]), f"{name} / {label}: unmasked tokens"
  assert not np.any(np.asarray(out.row_mask) & ~np.asarray(r.row_valid)), f"{name} / {label}"
  ts = np.asarray(r.token_step)
  rows = np.arange(r.num_rows)[:, None]
  if name in TOKEN_LEVEL:  # its tokens differ within a step: the step carries their mean
    for b, t in zip(*np.nonzero(np.asarray(r.step_valid))):
      at = np.asarray(r.loss_mask)[b] & (ts[b] == t)
      if at.any():
        assert steps[b, t] == pytest.approx(tokens[b, at].mean(), abs=1e-5), (name, label)
    return
  want = np.where(np.asarray(r.loss_mask), steps[rows, np.clip(ts, 0, None)], 0.0)
  np.testing.assert_allclose(tokens, want, err_msg=f"{name} / {label}")


@pytest.mark.parametrize("name", GROUP_NORMALISED)
@pytest.mark.parametrize("label", ["all_equal_correct", "all_equal_wrong", "singletons",
                                   "no_steps", "single_chain_tree", "shared_prefix_tree",
                                   "all_padding"])
def test_zero_where_nothing_differs(name, label):
  """All-equal groups and singleton groups get advantage exactly 0 (spec §3)."""
  r = build_rollouts(CASES[label], with_ftrl=True, with_ref=True, with_greedy=True, **SHAPE)
  out = advantages.get(name)(r)
  assert not np.any(np.asarray(out.steps)) and not np.any(np.asarray(out.rows)), label


def test_each_estimator_names_its_spec_section_and_the_grids_follow_it():
  """Issue 39: the ablation grids list estimators from the registry by spec section, so an
  estimator's section decides which grids it joins (4.1-4.3 the seeds', any other "beyond")."""
  from configs import ablate  # noqa: PLC0415
  from tirjax.advantages import registry  # noqa: PLC0415
  by_section = {s: advantages.names(spec=s) for s in ("4.1", "4.2", "4.3", "4.4")}
  assert sorted(sum(by_section.values(), [])) == advantages.names()
  assert (by_section["4.1"], by_section["4.2"]) == (["portool"], ["hidifftir"])
  assert {"grpo", "matchtir_km", "arpo"} <= set(by_section["4.3"])
  assert {"gigpo", "tree_grpo", "remax"} <= set(by_section["4.4"])
  assert set(ablate.BEYOND_ESTIMATORS) == set(by_section["4.4"]) - set(ablate.CONTROLS)
  assert set(ablate.ESTIMATORS) == set(advantages.names())
  assert {"ppo", "turn_ppo"} <= set(ablate.GRIDS["beyond"])  # the trainer has their critic
  # Controls (the oracle: an upper bound, not a method) join only the grids that name them.
  assert ablate.CONTROLS == ("oracle",) and advantages.get("oracle").spec == "4.4"
  named = {g for g, cells in ablate.GRIDS.items() if "oracle" in cells}
  assert named == {"credit_oracle", "credit12_oracle", "credit_k4", "credit_k2"}
  assert ablate.GRIDS["credit12_oracle"] == ablate.GRIDS["credit12"] + ("oracle",)
  assert ablate.GRIDS["credit_oracle"] == ablate.GRIDS["credit"] + ("oracle",)
  with pytest.raises(ValueError, match="spec='4.9' names no section of docs/spec.md"):
    registry.register("not_an_estimator", registry.get("grpo").options, spec="4.9",
                      reference=registry.get("grpo").reference)(None)
  assert "not_an_estimator" not in advantages.names()


def test_a_spec_section_is_documentation_not_a_gate():
  """Issue 57: an estimator registers without a section (and then has none to be listed by);
  any section of docs/spec.md is accepted, not only §4's."""
  from tirjax.advantages import registry  # noqa: PLC0415
  grpo = registry.get("grpo")
  try:
    registry.register("unsectioned", grpo.options, reference=grpo.reference)(grpo.fn)
    registry.register("sectioned_elsewhere", grpo.options, spec="5",
                      reference=grpo.reference)(grpo.fn)
    assert registry.get("unsectioned").spec is None
    assert "unsectioned" in advantages.names()
    assert "unsectioned" not in advantages.names(spec=("4.1", "4.2", "4.3", "4.4"))
    assert advantages.names(spec="5") == ["sectioned_elsewhere"]
  finally:
    registry._REGISTRY.pop("unsectioned", None)  # noqa: SLF001
    registry._REGISTRY.pop("sectioned_elsewhere", None)  # noqa: SLF001


@pytest.mark.parametrize("name", advantages.names())
def test_each_registration_s_protocol_builds_its_options(name):
  """Issue 57: what a registration says (its reference, protocol, rollout and loss settings) is
  well formed: the reference is found and callable, the settings build the trainer's options."""
  from configs import base  # noqa: PLC0415
  from tirjax.config import dataclass_from_config  # noqa: PLC0415
  from tirjax.episodes.options import MODES, RolloutOptions  # noqa: PLC0415
  from tirjax.loss import LossOptions  # noqa: PLC0415
  from tirjax.advantages.registry import thawed  # noqa: PLC0415
  entry = advantages.get(name)
  assert callable(entry.reference_fn)
  assert entry.protocol in base.PROTOCOLS and entry.rollout_mode in MODES
  dataclass_from_config(RolloutOptions, thawed(entry.rollout), "rollout")
  loss = thawed(entry.loss)
  if loss.get("aggregation") == "seq_mean_token_sum_norm":
    loss.setdefault("norm_constant", 1.0)
  dataclass_from_config(LossOptions, loss, "loss")


@pytest.mark.parametrize("kwargs, message", [
    (dict(reference="tirjax.testing.reference.group.grpo"), "expected 'module:function'"),
    (dict(reference=""), "expected 'module:function'"),
    (dict(reference="a:b", protocol="verl"), "protocol='verl'"),
    (dict(reference="a:b", loss=["token_mean"]), "loss: expected a mapping"),
])
def test_a_malformed_registration_fails_naming_what_is_wrong(kwargs, message):
  from tirjax.advantages import registry  # noqa: PLC0415
  with pytest.raises((ValueError, TypeError), match=message):
    registry.register("malformed", registry.get("grpo").options, **kwargs)
  assert "malformed" not in advantages.names()


def test_a_missing_reference_is_named_when_read():
  from tirjax.advantages import registry  # noqa: PLC0415
  grpo = registry.get("grpo")
  try:
    registry.register("refless", grpo.options, reference="tirjax.testing.reference.group:nope")(
        grpo.fn)
    with pytest.raises(LookupError, match="'refless': its reference .*group:nope"):
      registry.get("refless").reference_fn  # noqa: B018
  finally:
    registry._REGISTRY.pop("refless", None)  # noqa: SLF001


def test_the_readers_take_the_protocol_from_the_registration():
  """Issue 57: configs, the credit bench's losses, the tree estimators and the references are
  read from the registrations, not written again beside them."""
  from tirjax.advantages.registry import thawed  # noqa: PLC0415
  from tirjax.credit import cells, rollout_fidelity  # noqa: PLC0415
  from tirjax.testing import short_runs  # noqa: PLC0415
  from tirjax.testing.reference import REFERENCES  # noqa: PLC0415
  assert set(REFERENCES) == set(advantages.names())
  for name in advantages.names():
    entry = advantages.get(name)
    assert REFERENCES[name] is entry.reference_fn
    loss = cells.default_loss(name, max_tokens=384)
    config = short_runs.config(name, "model=tiny")
    for key, value in thawed(entry.loss).items():
      assert getattr(loss, key) == value == config.loss[key], (name, key)
    if entry.loss.get("aggregation") == "seq_mean_token_sum_norm":
      assert loss.norm_constant == 384.0
      assert config.loss.norm_constant == config.rollout.max_steps * config.rollout.max_new_tokens
    assert config.rollout.mode == entry.rollout_mode, name
    assert rollout_fidelity.own_kind(name) == ("tree" if entry.rollout_mode == "tree"
                                               else "independent")
  assert {n for n in advantages.names() if rollout_fidelity.own_kind(n) == "tree"} == {
      "portool", "tree_grpo"}
  assert cells.default_loss("dapo", 1).clip_high == 0.28
  assert cells.default_loss("grpo", 1) == cells.LossOptions()
