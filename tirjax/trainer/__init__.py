"""The trainer: a run from config to export (`train.run`; `experiments.train` is its command
line). `train` is the run in order, `parts` what its stages work with and how they are built,
`stages` the warm start, the RL loop and the final stage; around them the config (`sections`:
every section, the presets and `make`; `options`: the experiment's own sections) and its
resolution (`resolve`, `prepare`), tasks and tokenizers from the
environment registry (`tasks`), each process's share of a step (`processes`), evaluation,
SFT data, DAPO refill, metrics and progress. The jitted steps and their batches are
`tirjax.train_steps`."""
