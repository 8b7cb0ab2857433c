"""What the tests and the benchmarks share: independent loop references and batch builders.

`reference/` holds plain-loop implementations written from the SPEC (never sharing code with
the kernels); `records` builds a `Rollouts` batch from plain Python records, `synthetic` random
PORTool trees and independent rollouts, `synthetic_calls` random tool calls with ground truth,
`call_batches` call-level batches and their numpy views. They live in the package so that the
benchmarks can time the kernels against them without importing `tests/`.
"""
