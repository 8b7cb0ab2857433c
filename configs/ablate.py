"""Ablation grid: the estimators and their spec §4 options × seeds, one trainer run per cell.

    python -m experiments.ablate --config=configs/ablate.py --workdir=runs/ablate
    python -m experiments.ablate --config=configs/ablate.py:grid=portool,seeds=5 \\
        --workdir=runs/portool --parallel=4  # on >= 8 cores
    python -m experiments.ablate --config=configs/ablate.py:grid=smoke --workdir=/tmp/ablate_smoke

Argument (comma-separated presets):
`grid=all|estimators|portool|hidifftir|beyond|smoke|beyond_smoke|snapshot|default|credit|credit12|
credit_oracle|credit12_oracle|credit_k4|credit_k2|staleness` (default all), `seeds=N` (seeds 0..N-1; default 3, the credit
grids 5, smoke 2), `warm_start=per_seed|shared|none` (one SFT
per seed, one SFT for all seeds, or SFT inside every run; see `tirjax.ablation.grid`), and the
estimator configs' presets `model`, `env`, `sampler`, `mesh`, `steps`
(`tirjax.trainer.sections.PRESET_KEYS`), given to every cell's config. Each cell runs its estimator's own config file (paper defaults:
PORTool's tree rollouts, HiDiffTIR's `<answer>` protocol, ...) with the grid's overrides; see
`tirjax.ablation.grid` for the format.

Produces `<workdir>/<label>/seed<k>/`, an `experiments.train` run directory per cell and seed
(label e.g. `portool/fork_scale=none`); `<workdir>/sft-<hash>/seed<k>/`, the SFT warm start of
each seed that the RL cells start from (one per answer protocol: two for `grid=all`); and
`<workdir>/report/` (report.md: eval accuracy, steps, unanswerable rate, formatting reward,
training reward and unlearning rates as mean ± 95% CI over seeds, paired by seed against `grpo`;
learning curves). `grid=all` is every cell of the grids below × 3 seeds and their warm starts:
about half a CPU-day on 2 cores (each run's seconds are in its summary; `grid=default`'s in
benchmarks/results/ablation_default/). `grid=estimators` is every registered estimator but the
controls (`CONTROLS`: the oracle); `grid=beyond` puts spec §4.4's estimators (and any
registered without a section) next to grpo, portool and hidifftir, with GiGPO on trees and with
prefix anchors and CISPO's loss on grpo; `grid=beyond_smoke` runs those estimators as
`grid=smoke` runs its two. `grid=snapshot` (results:
benchmarks/results/ablation_toolworld/; the 12 estimators × 3 seeds from one shared warm start
per answer protocol, `SNAPSHOT_STEPS` RL steps, one final evaluation).
`grid=default` (results: benchmarks/results/ablation_default/): grpo, hidifftir and portool on
the default's protocol (`make run`: 1200 SFT steps, 40 RL steps), one warm start per seed, 3
seeds, at `--parallel=1` (2 at a time on 2 cores is slower); what it found is in its
report.md. `grid=smoke` (grpo and portool, 2 seeds, 2 steps each, 4 eval tasks) takes 2-3
minutes and checks the pipeline, not the methods (accuracies ~0).

`grid=credit` (6 cells x 5 seeds + 5 warm starts):
the prediction written from the fidelity figures before it ran is
benchmarks/results/ablation_credit/prediction.json; the 5-seed verdict, with each cell's
credit while training, is benchmarks/results/ablation_credit/verdict.md.
`grid=credit12` is its one redesign (grpo, hidifftir and portool; groups and trees of 12 rows,
4 queries a step) from the same warm starts (copy `<credit workdir>/sft-2d2a143a` into its
workdir): its prediction and verdict are in benchmarks/results/ablation_credit12/.
`grid=credit_oracle` and `grid=credit12_oracle` are those grids with the `oracle` positive
control added (spec §4.4: +1 / −1 per turn from toolworld's ground-truth turn labels), on the
same settings; run in the workdir of the grid they extend, only the oracle's runs are new. If
the oracle does not beat GRPO there, the testbed cannot show a credit effect. Not run yet.
`grid=credit_k4` (grpo, oracle, hidifftir with strict matching, portool) and `grid=credit_k2` (grpo, oracle) are the
signal-limited testbed of issue 51 (`knockout_testbed` below): one query family with 4 and 2
directions per task, for the dose-response: a direction-blind policy is right on exactly
2^-K of each task's direction patterns and no early answer is right (measured in
benchmarks/results/knockout_patterns.md). Not run yet; its prediction is to be committed
before any cell runs.
`grid=staleness` (grpo and hidifftir at `train.max_staleness` = 0, 1 and 2, every cell with
the token-level correction that k >= 1 needs, on the default's protocol and warm starts)
ablates k-step off-policy rollouts against the estimator (`tirjax/trainer/staleness.py`). Not
run yet.

Expected result (the papers' claims on 1.7B-7B models and spec §4.1; at the tiny scale
`grid=default` sees no cell separate from GRPO at 3 seeds: its report.md):
PORTool above GRPO in eval accuracy, with fewer tool-call steps and a lower unanswerable rate
(PORTool §4); PORTool's unlearning rate far below GRPO's, rising sharply with
`shared_step_trj=own`; HiDiffTIR above GRPO, and each of its ablations
(`trajectory_difficulty=false`, `turn_difficulty=false`) below full HiDiffTIR (its Table 2).
"""

import ml_collections

from configs import base
from tirjax import advantages
from tirjax.config import parse_preset_arg
from tirjax.trainer import sections

SNAPSHOT_STEPS = 10
# The seeds' estimators and their baselines (spec §4.1-4.3): the committed snapshot's cells;
# then every other registered estimator: spec §4.4's (verl's estimators, GiGPO, Tree-GRPO) and
# any registered without a section. Both lists are the registry's, less the controls.
# Controls (spec §4.4's oracle) are bounds, not methods: they read what no method has (the
# turns' ground-truth labels) and run only where the environment gives it, so they join only
# the grids that name them (`grid=credit_oracle`, `credit12_oracle`), never the lists below.
CONTROLS = ("oracle",)
SEED_ESTIMATORS = tuple(advantages.names(spec=("4.1", "4.2", "4.3")))
BEYOND_ESTIMATORS = tuple(n for n in advantages.names()
                          if n not in SEED_ESTIMATORS and n not in CONTROLS)
METHODS = SEED_ESTIMATORS + BEYOND_ESTIMATORS
ESTIMATORS = METHODS + tuple(n for n in CONTROLS if n in advantages.names())  # their configs
# The step- and tree-level comparators side by side with the seeds' methods, on their own
# rollouts and on each other's (GiGPO on PORTool's trees, Tree-GRPO and PORTool on independent
# rows), with CISPO's loss on GRPO (it acts from the second update of a batch on).
BEYOND = (("grpo", "portool", "hidifftir") + BEYOND_ESTIMATORS +
          ("gigpo/anchor=prefix", "gigpo/rollout.mode=tree", "grpo/loss.surrogate=cispo"))
PORTOOL = ("grpo", "portool", "portool/tree_aggregation=max", "portool/tree_aggregation=mean",
           "portool/fork_scale=none", "portool/shared_step_trj=own", "portool/omega1=0",
           "portool/rollout.mode=independent")
HIDIFFTIR = ("grpo", "hidifftir", "hidifftir/success_rate=smoothed",
             "hidifftir/trajectory_difficulty=false", "hidifftir/turn_difficulty=false",
             "hidifftir/answer_turn=none", "matchtir_km", "matchtir_km/matching=greedy")
# The committed snapshot: every estimator and the ablations the papers' claims rest on.
SNAPSHOT_CELLS = SEED_ESTIMATORS + ("portool/omega1=0", "portool/fork_scale=none",
                               "portool/rollout.mode=independent",
                               "hidifftir/turn_difficulty=false",
                               "hidifftir/trajectory_difficulty=false")
# The default's snapshot (issue 26): the seeds' two methods against GRPO, each on `make run`'s
# design, so that the estimator (and PORTool's tree rollouts) is all that differs.
DEFAULT_CELLS = ("grpo", "hidifftir", "portool")
# The credit testbed (issue 37): the seeds' two methods, the step- and turn-level comparators and
# two outcome baselines, on queries where an outcome cannot say which step went wrong.
CREDIT_CELLS = ("grpo", "hidifftir", "portool", "matchtir_km", "gigpo",
                "reinforce_plus_plus_baseline")
CREDIT12_CELLS = ("grpo", "hidifftir", "portool")  # its redesign: the claims' cells
# Each credit grid with the oracle (a positive control, spec §4.4) beside its cells, on the
# same settings: the upper bound of what per-turn credit buys on that testbed. Run in the
# workdir of the grid it extends, its finished runs are skipped: only the oracle's cells run.
CREDIT_ORACLE_CELLS = CREDIT_CELLS + ("oracle",)
CREDIT12_ORACLE_CELLS = CREDIT12_CELLS + ("oracle",)
# The signal-limited testbed (issue 51): one query family at K = 4 and K = 2 directions, the
# seeds' methods at K = 4 and the controls at both, for the dose-response (the gap to grpo
# should grow with K). HiDiffTIR matches calls strictly there (`rollout.strict_directions`: a
# wrong direction is unmatched, not a 0.75 near-match), so that its turn credit sees the lever.
CREDIT_K4_CELLS = ("grpo", "oracle", "hidifftir/rollout.strict_directions=true", "portool")
CREDIT_K2_CELLS = ("grpo", "oracle")
# `grid=staleness` (issue 55): k-step off-policy rollouts (`train.max_staleness`) against the
# synchronous loop, grpo and hidifftir at k = 0, 1 and 2 on the default's protocol, every cell
# with the token-level correction that k >= 1 needs, so that k is all that differs within an
# estimator (and all share one warm start per seed).
STALENESS_CELLS = tuple(
    f"{name}/loss.rollout_correction.is_level=token" + (f",train.max_staleness={k}" if k else "")
    for name in ("grpo", "hidifftir") for k in (0, 1, 2))
GRIDS = {"all": tuple(dict.fromkeys(METHODS + PORTOOL + HIDIFFTIR + BEYOND)),
         "estimators": METHODS, "portool": PORTOOL, "hidifftir": HIDIFFTIR, "beyond": BEYOND,
         "smoke": ("grpo", "portool"), "beyond_smoke": BEYOND_ESTIMATORS,
         "snapshot": SNAPSHOT_CELLS, "default": DEFAULT_CELLS, "credit": CREDIT_CELLS,
         "credit12": CREDIT12_CELLS, "credit_oracle": CREDIT_ORACLE_CELLS,
         "credit12_oracle": CREDIT12_ORACLE_CELLS, "credit_k4": CREDIT_K4_CELLS,
         "credit_k2": CREDIT_K2_CELLS, "staleness": STALENESS_CELLS}
# The committed snapshot (benchmarks/results/ablation_toolworld/report.md): every estimator from one
# shared SFT warm start per answer protocol, a short RL budget that fits a 2-core CPU in about
# an hour; its differences are expected to be within noise at this budget.
SNAPSHOT = dict(train=dict(steps=SNAPSHOT_STEPS, eval_every=0, eval_at_start=False,
                           checkpoint_every=SNAPSHOT_STEPS))
# `grid=default`: every cell on the default's protocol (configs/hidifftir.py, `make run`): its
# answer protocol (tags) and loss (KL 0.001 k3, entropy 0.001; PORTool's protocol has neither,
# and answers without tags), so that all cells share one SFT warm start per seed.
DEFAULT_PROTOCOL = dict(
    rollout=dict(answer_protocol=base.hidifftir_protocol()["rollout"]["answer_protocol"]),
    loss=base.hidifftir_protocol()["loss"])
# `grid=credit`: the default's protocol and design (`make run`: 1200 SFT steps on confused
# demonstrations, 40 RL steps of 8 queries x 6 rows at T = 0.6) on the credit testbed: every
# query a 4-hop chain with two directions in different steps
# (`env.toolworld.chain_directions=2`), so a coin-flip policy answers one query in four and a
# failure does not say which direction was wrong; evaluations every 8 RL steps on the first 64
# eval tasks (curves of 6 points), the first and the last on all 256.
CREDIT = dict(DEFAULT_PROTOCOL,
              env=dict(toolworld=dict(chain_directions=2, hop_weights=(0.0, 0.0, 0.0, 1.0))),
              train=dict(eval_every=8, eval_subset=64))
# `grid=credit12`, the credit testbed's redesign: on grid=credit 59% of PORTool's 6-leaf trees
# and 46% of GRPO's groups had no success (18% of rows succeed from the warm start), so most
# turn-level signal never reached the update. The same rows a step (48) in 4 groups or trees
# of 12 (mini-batches of one query: 4 updates a step, as before); RL keys only, so the cells
# start from grid=credit's warm starts.
CREDIT12_RL = dict(rollout=dict(n=12), train=dict(queries_per_step=4, mini_batch_queries=1))
# `grid=credit_k4` and `grid=credit_k2`, the signal-limited testbed (issue 51): the knockout
# chains (`env.toolworld.chain_family=knockout`: K compares, each in a step of its own after a
# look-up of the city the compare before named, the answer the sum of the compares' winning
# values, so that the 2^K direction patterns give 2^K different answers) at K = 4 and K = 2,
# no unanswerable task (`p_down=0`, so that no all-fail group and no collateral-blame or
# free-credit count holds one), on grid=credit12's design (groups and trees of 12 rows). The
# warm start is the default's (1200 SFT steps on confused demonstrations: each direction a
# coin flip), so that its success rate is 2^-K times the rest of the plan's (no wrong pattern
# and no early answer is right: `toolworld.patterns`): at most 1/16 at K = 4, the 5-10% the
# issue aims at, and 1/4 at K = 2; `KNOCKOUT_SFT_STEPS` is the knob. Measured at K = 4 with
# 1200 steps (benchmarks/results/knockout_warm_start.md, one seed): far below that aim, most
# samples failing on an argument or a miscopy before any direction, so these grids are not
# ready to run: a step count (or demonstration fix) that reaches the aim is still to be
# measured, at K = 2 too. Curves: greedy evaluations every 5 RL steps (9 points
# over 40 steps) on the first 128 of 512 eval tasks, the first and the last on all 512.
# T_max = 2K + 3: the 2K + 1 tool steps (K look-up steps, K compares, the last add), the answer
# and one spare step; rows of 768 tokens at K = 4, whose longest confused demonstrations
# outgrow 640 (benchmarks/results/knockout_patterns.md; K = 2 keeps the built-in 512); up to
# K + 1 calls a step (the first step looks up both first cities and every challenger) and
# 4K - 1 in all (3K look-ups and compares, K - 1 adds).
KNOCKOUT_SFT_STEPS = 1200
KNOCKOUT_MAX_TOKENS = {2: 512, 4: 768}


def knockout_testbed(k: int) -> dict:
  """The overrides of `grid=credit_k<k>` (see above)."""
  return dict(DEFAULT_PROTOCOL,
              env=dict(eval_tasks=512, toolworld=dict(chain_directions=k,
                                                      chain_family="knockout", p_down=0.0)),
              rollout=dict(DEFAULT_PROTOCOL["rollout"], max_steps=2 * k + 3,
                           shapes=dict(max_tokens=KNOCKOUT_MAX_TOKENS[k],
                                       max_calls=max(4, k + 1), max_gt_calls=max(8, 4 * k - 1))),
              sft=dict(steps=KNOCKOUT_SFT_STEPS),
              train=dict(eval_every=5, eval_subset=128))
# The smoke grid: every stage (SFT warm start, tree and independent rollouts, updates, eval,
# export, report) on the smallest sizes.
SMOKE = dict(env=dict(train_tasks=16, eval_tasks=4),
             sft=dict(steps=2, batch_size=4, num_demos=8),
             train=dict(queries_per_step=1, mini_batch_queries=0),
             rollout=dict(n=2, max_steps=2, max_new_tokens=24))
CELL_PRESETS = tuple(k for k in sections.PRESET_KEYS if k != "rollout")  # rollout modes are cells'


def get_config(arg=None):
  presets = parse_preset_arg(arg, {"grid": tuple(GRIDS), "seeds": None,
                                   "warm_start": ("per_seed", "shared", "none"),
                                   **{k: sections.PRESET_KEYS[k] for k in CELL_PRESETS}})
  grid = presets.get("grid", "all")
  smoke = grid in ("smoke", "beyond_smoke")
  seeds = presets.get("seeds", "2" if smoke else "5" if grid.startswith("credit") else "3")
  if not seeds.isdigit() or int(seeds) < 1:
    raise ValueError(f"config argument seeds={seeds}: expected an integer >= 1")
  cell_presets = {k: presets[k] for k in CELL_PRESETS if k in presets}
  if smoke:
    cell_presets.setdefault("steps", "2")

  c = ml_collections.ConfigDict()
  c.preset = ",".join(f"{k}={v}" for k, v in cell_presets.items())
  # Per estimator, another config file: "path.py" or "path.py:arg" ("" = configs/<name>.py).
  c.configs = ml_collections.ConfigDict({name: "" for name in ESTIMATORS})
  c.overrides = ml_collections.ConfigDict(dict(train=dict(progress_bar=False)))
  if grid == "snapshot":
    presets.setdefault("warm_start", "shared")
  extra = SMOKE if smoke else {"snapshot": SNAPSHOT, "default": DEFAULT_PROTOCOL,
                               "staleness": DEFAULT_PROTOCOL,
                               "credit": CREDIT, "credit12": CREDIT, "credit_oracle": CREDIT,
                               "credit12_oracle": CREDIT, "credit_k4": knockout_testbed(4),
                               "credit_k2": knockout_testbed(2)}.get(grid, {})
  for section, values in extra.items():
    c.overrides[section] = ml_collections.ConfigDict({**c.overrides.get(section, {}), **values})
  c.rl_overrides = ml_collections.ConfigDict(
      CREDIT12_RL if grid in ("credit12", "credit12_oracle", "credit_k4", "credit_k2") else {})
  c.cells = GRIDS[grid]
  c.seeds = tuple(range(int(seeds)))
  c.warm_start = presets.get("warm_start", "per_seed")
  c.compilation_cache = True
  c.report = ml_collections.ConfigDict(dict(baseline="grpo", last_rl=5,
                                            title=f"tirjax ablation: grid={grid}"))
  c.lock()
  return c
