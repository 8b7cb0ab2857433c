"""How often a policy takes the direction a toolworld question states (`tirjax.trainer.
direction`): P(right step) against the flipped step, teacher-forced, averaged over eval tasks.

    python -m experiments.studies.direction_probe --policy=runs/default/hf_export --tasks=256

The tasks are toolworld eval tasks whose plans all take a direction
(`env.toolworld.p_direction` = 1, no tool down). Confused demonstrations (`sft.demos.p_confuse` = 1) leave P(right) at 0.5 after SFT;
only RL raises it. Prints one JSON line.
"""

import json

from absl import flags

from tirjax import cli
from tirjax.env.toolworld import Difficulty, make_tasks
from tirjax.env.toolworld.direction import direction_preference
from tirjax.trainer.tasks import load_tokenizer
from tirjax.models.hf_io import load_hf

POLICY = flags.DEFINE_string("policy", None, "An HF checkpoint directory (a run's hf_export).")
TASKS = flags.DEFINE_integer("tasks", 256, "Eval tasks (each takes a direction).")
SEED = flags.DEFINE_integer("seed", 0, "The toolworld task stream.")
PROTOCOL = flags.DEFINE_enum("answer_protocol", "answer_tag", ("answer_tag", "response_gen"),
                             "The policy's answer protocol.")
flags.mark_flag_as_required("policy")


def main(argv):
  del argv
  tasks = make_tasks("eval", TASKS.value, seed=SEED.value,
                     difficulty=Difficulty(p_direction=1.0, p_down=0.0))
  out = direction_preference(load_hf(POLICY.value), load_tokenizer(POLICY.value), tasks,
                             PROTOCOL.value)
  print(json.dumps({"policy": POLICY.value, **out}))


if __name__ == "__main__":
  cli.run(main)
