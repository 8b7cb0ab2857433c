"""Credit fidelity (spec §4.5): the measures on a hand-built batch whose figures are known,
against plain loops on random ragged batches, under shuffled labels, and under a flipped sign."""

import os
import types

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tirjax.metrics import credit as fid
from tirjax.env.toolworld.failures import RIGHT
from tirjax.testing.reference import fidelity as ref
from tirjax.trainer.rl_metrics import credit_metrics

# Two queries of two rows each. Query 0 has a success (row 0) and a failure (row 1); query 1
# fails twice (an all-fail group). Steps per row: 2, 3, 1, 2.
LABELS = [[RIGHT, RIGHT], [RIGHT, "direction", "answer"], ["format"], [RIGHT, "argument"]]
TURN_ADV = [[0.8, 0.8], [-0.5, -0.5, -0.5], [0.0], [0.0, 0.0]]  # GRPO-like: the row's advantage
OUTCOME = [1.0, -1.0, -1.0, -1.0]


def hand_batch(turn_adv=TURN_ADV, tokens_per_step=3, max_steps=4):
  """A batch (the fields `turn_table` reads) whose every step has `tokens_per_step` loss tokens
  with the step's advantage, after a 2-token prompt and before tool-response tokens."""
  rows, length = len(turn_adv), 2 + max_steps * (tokens_per_step + 1)
  token_step = np.full((rows, length), -1)
  loss_mask = np.zeros((rows, length), bool)
  adv = np.zeros((rows, length), np.float32)
  for b, steps in enumerate(turn_adv):
    pos = 2
    for t, a in enumerate(steps):
      token_step[b, pos:pos + tokens_per_step] = t
      loss_mask[b, pos:pos + tokens_per_step] = True
      adv[b, pos:pos + tokens_per_step] = a
      pos += tokens_per_step + 1  # one tool-response token, outside the loss
  batch = types.SimpleNamespace(group_id=np.array([0, 0, 1, 1]), row_valid=np.ones(rows, bool),
                                outcome=np.array(OUTCOME), token_step=token_step,
                                loss_mask=loss_mask, max_steps=max_steps, num_rows=rows)
  return batch, adv


def test_a_hand_built_batch_gives_its_known_figures():
  batch, adv = hand_batch()
  turns = fid.turn_table(batch, adv, LABELS)
  assert len(turns.advantage) == 8 and turns.all_fail.tolist() == [False] * 5 + [True] * 3
  m = fid.fidelity(turns)
  # right turns: 0.8, 0.8, -0.5, 0.0; wrong: -0.5, -0.5, 0.0, 0.0. Pairs right > wrong: the
  # two 0.8s beat all 4 (8); -0.5 ties two (1); 0.0 beats two and ties two (3): 12 of 16.
  assert m["auc"] == pytest.approx(12 / 16)
  # within queries: query 0's right (0.8, 0.8, -0.5) over its wrong (-0.5, -0.5): 5 of 6;
  # query 1 (all-fail) right 0.0 over wrong (0.0, 0.0): two ties, 1 of 2
  assert m["auc_query"] == pytest.approx(6 / 8)
  assert m["auc_all_fail"] == pytest.approx(1 / 2)
  assert m["wrong_negative"] == pytest.approx(2 / 4)
  assert m["collateral_blame"] == pytest.approx(1 / 2)  # right turns of failed rows: -0.5, 0.0
  assert m["free_credit"] is None  # no wrong turn in a successful episode
  assert m["no_signal"] == pytest.approx(3 / 8)  # rows 2 and 3
  assert m["no_signal_all_fail"] == pytest.approx(3 / 3)


def test_a_turns_advantage_is_the_mean_of_its_loss_tokens():
  batch, adv = hand_batch()
  adv[0, 2] = 2.0  # one of step 0's three tokens: the step's mean becomes (2 + 0.8 + 0.8) / 3
  adv[0, 5] = 9.0  # a tool-response token: outside the loss, it counts for nothing
  got = fid.turn_advantages(adv, batch.token_step, batch.loss_mask, batch.max_steps)
  assert got[0, 0] == pytest.approx(3.6 / 3) and got[0, 1] == pytest.approx(0.8)
  assert got[2, 1:].tolist() == [0.0] * 3  # steps without tokens
  np.testing.assert_allclose(got, ref.turn_advantages(adv, batch.token_step, batch.loss_mask,
                                                      batch.max_steps), rtol=1e-6)


def test_padding_rows_and_unlabelled_rows_do_not_count():
  batch, adv = hand_batch()
  batch.row_valid[3] = False
  turns = fid.turn_table(batch, adv, LABELS[:2] + [None, LABELS[3]])
  assert len(turns.advantage) == 5


@st.composite
def tables(draw):
  """Random ragged turn tables: queries of 1-4 rows, rows of 1-5 turns, advantages from a
  small set (so that ties and zeros are common), labels and outcomes at random."""
  rng = np.random.default_rng(draw(st.integers(0, 2**31)))
  query, adv, right, outcome = [], [], [], []
  for q in range(draw(st.integers(1, 6))):
    for _ in range(int(rng.integers(1, 5))):
      o = float(rng.choice([-1.0, 0.0, 1.0]))
      for _ in range(int(rng.integers(1, 6))):
        query.append(q)
        adv.append(float(rng.choice([-1.0, -0.25, 0.0, 0.0, 0.5, 1.0])))
        right.append(bool(rng.random() < 0.5))
        outcome.append(o)
  succeeded = {q for q, o in zip(query, outcome) if o > 0}
  return fid.TurnTable(np.array(query), np.array(adv),
                       np.where(right, RIGHT, "direction").astype(str), np.array(outcome),
                       np.array([q not in succeeded for q in query]))


@settings(max_examples=60, deadline=None)
@given(tables())
def test_measures_equal_the_loops(turns):
  got = fid.fidelity(turns)
  want = ref.measures(turns.query.tolist(), turns.advantage.tolist(), turns.right.tolist(),
                      turns.outcome.tolist())
  assert set(got) == set(fid.MEASURES)
  for k in fid.MEASURES:
    assert (got[k] is None) == (want[k] is None), k
    if want[k] is not None:
      assert got[k] == pytest.approx(want[k]), k


def _informative(rng, n_queries=120):
  """Turns whose advantage tells right from wrong (right ~ N(0.5, 1), wrong ~ N(-0.5, 1))."""
  query = np.repeat(np.arange(n_queries), 10)
  right = rng.random(query.size) < 0.5
  adv = rng.normal(np.where(right, 0.5, -0.5), 1.0)
  outcome = np.repeat(rng.choice([-1.0, 1.0], n_queries), 10)
  return fid.TurnTable(query, adv, np.where(right, RIGHT, "argument").astype(str), outcome,
                       outcome < 0)


def test_shuffled_labels_give_an_auc_whose_interval_holds_one_half():
  rng = np.random.default_rng(0)
  turns = _informative(rng)
  lo, hi = fid.bootstrap_ci(turns, n=300, seed=1)["auc"]
  assert lo > 0.6  # informative labels: far from chance
  shuffled = fid.TurnTable(turns.query, turns.advantage, rng.permutation(turns.label),
                           turns.outcome, turns.all_fail)
  lo, hi = fid.bootstrap_ci(shuffled, n=300, seed=1)["auc"]
  assert lo < 0.5 < hi


def test_a_flipped_sign_moves_every_measure():
  """A = −A mirrors each measure: AUC → 1 − AUC, and the shares < 0 become shares > 0."""
  batch, adv = hand_batch([[0.8, 0.4], [-0.5, -0.2, -0.7], [0.3], [0.45, 0.6]])
  labels = [[RIGHT, "tool"], [RIGHT, RIGHT, "answer"], ["format"], [RIGHT, "argument"]]
  turns = fid.turn_table(batch, adv, labels)
  flipped = fid.turn_table(batch, -adv, labels)
  m, f = fid.fidelity(turns), fid.fidelity(flipped)
  assert f["auc"] == pytest.approx(1 - m["auc"]) and m["auc"] != pytest.approx(0.5)
  assert f["auc_query"] == pytest.approx(1 - m["auc_query"])
  assert m["auc_query"] != pytest.approx(0.5)
  wrong = ~turns.right
  assert m["wrong_negative"] == pytest.approx((turns.advantage[wrong] < 0).mean())
  assert f["wrong_negative"] == pytest.approx((turns.advantage[wrong] > 0).mean())
  assert f["wrong_negative"] != pytest.approx(m["wrong_negative"])
  assert m["free_credit"] == pytest.approx(1.0) and f["free_credit"] == pytest.approx(0.0)
  assert m["collateral_blame"] == pytest.approx(2 / 3)
  assert f["collateral_blame"] == pytest.approx(1 / 3)


def test_empty_denominators_give_none_and_never_nan():
  turns = fid.TurnTable(np.array([0, 0]), np.array([0.0, 0.0]), np.array([RIGHT, RIGHT]),
                        np.array([1.0, 1.0]), np.array([False, False]))
  m = fid.fidelity(turns)
  assert m["auc"] is None and m["wrong_negative"] is None and m["no_signal_all_fail"] is None
  assert m["auc_query"] is None and m["auc_all_fail"] is None
  assert m["no_signal"] == 1.0
  ci = fid.bootstrap_ci(turns, n=20)
  assert ci["auc"] is None and ci["no_signal"] == (1.0, 1.0)


def test_the_bootstrap_resamples_whole_queries():
  """One query: every resample is the whole batch, so each interval is a point (resampling
  turns instead would spread it)."""
  batch, adv = hand_batch([[0.8, 0.4], [-0.5, -0.2, -0.7], [0.3], [0.1, 0.6]])
  batch.group_id[:] = 0
  turns = fid.turn_table(batch, adv, [[RIGHT, "tool"], [RIGHT, RIGHT, "answer"], ["format"],
                                      [RIGHT, "argument"]])
  m, ci = fid.fidelity(turns), fid.bootstrap_ci(turns, n=50, seed=0)
  for k in ("auc", "auc_query", "wrong_negative", "collateral_blame", "no_signal"):
    assert ci[k] == pytest.approx((m[k], m[k])), k


def test_the_training_metrics_are_the_measures_of_the_steps_turns():
  batch, adv = hand_batch()
  got = credit_metrics(batch, types.SimpleNamespace(tokens=adv), LABELS)
  want = fid.fidelity(fid.turn_table(batch, adv, LABELS))
  assert got == {f"credit/{k}": v for k, v in want.items() if v is not None}
  assert "credit/free_credit" not in got and got["credit/auc"] == pytest.approx(0.75)


@pytest.mark.slow
def test_the_entry_point_measures_every_estimator_on_both_rollout_kinds(tmp_path):
  """`tirjax.credit.rollout_fidelity.measure` end to end on a tiny random policy (its turns are mostly
  format failures: the pipeline, not the figures, is under test here)."""
  from configs import hidifftir
  from tirjax.credit import rollout_fidelity
  from tirjax import advantages
  from tirjax.advantages.critic import without_critics
  from tirjax.env.toolworld import build_tokenizer
  from tirjax.models import config as model_config
  from tirjax.models.decoder import init
  from tirjax.models.hf_io import export_hf
  from tirjax.trainer.tasks import load_tokenizer

  tok_dir = build_tokenizer(str(tmp_path / "tokenizer"), seed=0)
  model = init(model_config.tiny(vocab_size=len(load_tokenizer(str(tok_dir)))), seed=0)
  policy = export_hf(model, str(tmp_path / "policy"), source_dir=str(tok_dir))
  config = hidifftir.get_config("model=tiny")
  with config.unlocked():
    config.train.queries_per_step = 2
    config.rollout.n = 2
    config.rollout.max_new_tokens = 24
  out = str(tmp_path / "fidelity")
  result = rollout_fidelity.measure(config, policy, 4, out, resamples=20)
  for ext in (".json", ".md", ".png"):
    assert os.path.exists(out + ext)
  assert result["queries"] == 4 and set(result["rollouts"]) == {"independent", "tree"}
  for kind in ("independent", "tree"):
    assert set(result["estimators"][kind]) == set(without_critics(advantages.names()))
    assert result["rollouts"][kind]["turns"] > 0
    for e in result["estimators"][kind].values():
      for k, v in e["measures"].items():
        assert v is None or 0 <= v <= 1, (k, v)
  assert result["own"]["portool"] == "tree" and result["own"]["grpo"] == "independent"
  critics = set(advantages.names()) - set(without_critics(advantages.names()))
  assert critics and set(result["not_measured"]) == critics  # ppo, turn_ppo: stated, not dropped
  with pytest.raises(FileExistsError, match="never overwritten"):
    rollout_fidelity.measure(config, policy, 4, out, resamples=20)


def test_the_table_names_each_estimator_left_unmeasured_and_why():
  """A critic's estimators have no rows (no warm-up of the critic yet): the markdown says so,
  rather than leaving a reader to wonder why ppo is missing."""
  from tirjax.credit import rollout_fidelity
  result = {"checkpoint": "p", "queries": 1, "queries_per_batch": 1, "rows_per_query": 2,
            "temperature": 1.0, "tree_branching": 2, "bootstrap_resamples": 1, "seconds": 0.0,
            "machine": {}, "rollouts": {}, "own": {}, "estimators": {},
            "not_measured": {"ppo": "reason a", "turn_ppo": "reason b"}}
  text = rollout_fidelity.markdown(result)
  assert "not measured: ppo (reason a)" in text and "not measured: turn_ppo (reason b)" in text
  del result["not_measured"]  # results written before the key existed still render
  assert "not measured" not in rollout_fidelity.markdown(result)


def test_the_figure_draws_a_percentile_interval_that_misses_its_estimate(tmp_path):
  """A bootstrap percentile interval of a ratio need not hold the point estimate (seen on a run
  of 8 queries, where the figure then raised); the figure still draws it."""
  from tirjax.credit import rollout_fidelity
  measures = {"auc_query": 0.6, "collateral_blame": 0.425, "no_signal_all_fail": 0.1}
  ci = {"auc_query": [0.5, 0.7], "collateral_blame": [0.448, 0.681],
        "no_signal_all_fail": [0.0, 0.2]}
  result = {"own": {"grpo": "independent"},
            "estimators": {"independent": {"grpo": {"measures": measures, "ci95": ci}}}}
  rollout_fidelity.figure(result, str(tmp_path / "f.png"))
  assert (tmp_path / "f.png").stat().st_size > 0


def test_a_query_drawn_twice_is_two_queries_of_the_resample():
  batch, adv = hand_batch()
  turns = fid.turn_table(batch, adv, LABELS)
  twice = fid.resample(turns, [0, 0])
  assert twice.query.tolist() == [0] * 5 + [1] * 5
  assert twice.advantage.tolist() == turns.advantage[:5].tolist() * 2
  # query 0's 3 right and 2 wrong turns twice: 2·6 within-query pairs, not (2·3)·(2·2)
  m = fid.fidelity(twice)
  assert m["auc_query"] == pytest.approx(5 / 6)


def test_episode_labels_take_the_labeller_from_the_environment_registry(monkeypatch):
  """Issue 57: the labels are the named environment's (`Environment.turn_labels`), whatever
  it is; an environment that labels no turns is refused by name."""
  from tirjax.env import registry  # noqa: PLC0415

  seen = []

  def label(task, results, answered, verdict):
    seen.append((task, tuple(results), answered, verdict))
    return [RIGHT, "own_kind"][:len(results)]

  fake = registry.Environment(name="fake", draw=lambda *a: [], turn_labels=label)
  monkeypatch.setitem(registry._REGISTRY, "fake", fake)
  rec = lambda row, task_id, n: types.SimpleNamespace(row=row, task_id=task_id,
                                                       results=["r"] * n, status="answered",
                                                       verdict="true")
  records = [rec(0, "a", 2), rec(2, "b", 1), rec(3, "unknown", 2)]
  got = fid.episode_labels(records, {"a": "task a", "b": "task b"}.get, 4, "fake")
  assert got == [[RIGHT, "own_kind"], None, [RIGHT], None]
  assert seen == [("task a", ("r", "r"), True, "true"), ("task b", ("r",), True, "true")]
  with pytest.raises(ValueError, match="env 'doors' labels no turns.*toolworld"):
    fid.episode_labels(records, {}.get, 4, "doors")
