"""What the tests and the benchmarks share: loop references, batch builders and test doubles.

The rule: `tirjax/testing/` holds everything a test uses that is not itself a test and works
without pytest (builders, references, doubles, checks, servers to test against), so that the
benchmarks and experiments can use it without importing `tests/`; `tests/` holds the tests and
`conftest.py`, whose pytest fixtures wrap what lives here. The library never imports this
package; modules here may need test-only packages (torch, hypothesis: requirements-test.txt).

* `reference/`: plain-loop implementations written from the spec (never sharing code with the
  kernels).
* Batches: `records` builds a `Rollouts` batch from plain Python records, `synthetic` random
  PORTool trees and independent rollouts, `synthetic_calls` random tool calls with ground
  truth, `call_batches` call-level batches, `strategies` hypothesis strategies of tree
  batches, `padding` the same batch with its rows moved or its shape grown.
* Inputs: `chain_tasks` random chain tasks (a hypothesis strategy) and random policies over
  them, `checkpoint_states` a tiny train state and the target to restore it into,
  `dataset_rows` ToolHop and FTRL rows in their sources' formats.
* Checks: `estimator_checks` (kernel against reference, row order, padding), `bookkeeping`
  (an episode batch against what was sampled), `compile_counts` (compilations and traces),
  `checkpoint_states.assert_same` (a restored train state against the saved one),
  `sandbox_probes` (whether libseccomp loads, a process's CPU time, a worker's pid, the
  hook-off gadget).
* Doubles and fixtures: `scripted_samplers` (the `Sampler` protocol without a model),
  `train_setup` (a tiny decoder, its optimizer and mesh, random policy and SFT batches),
  `tiny_hf` (a tiny torch Qwen3 for vLLM), `vllm_processes` (small servers and their
  processes), `vllm_toolworld` (one server of a tirjax model over the toolworld vocabulary).
* Trainer runs: `short_runs` (every config's name, the short settings and the trainer's command
  line, and waits on a run's metrics and checkpoints to kill it at).
"""
