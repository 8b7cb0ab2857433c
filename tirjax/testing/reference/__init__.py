"""Independent reference implementations, written from the spec (one module per topic).

For the advantage estimators, `REFERENCES[name](batch, **options)` returns
`dict(steps=[B, T], rows=[B])`, with `batch` the numpy arrays of a `Rollouts`
(`{f.name: np.asarray(getattr(r, f.name))}`, call encodings under `calls.<field>`) and
`options` the fields of the estimator's options dataclass (same names and defaults). Plain
Python loops and dicts over groups, trees and rows: slow on purpose, never sharing code with
the kernels. `REFERENCES` merges the per-module dicts.
"""

from tirjax.testing.reference import agentic, group, matching, oracle, portool, verl_baselines
from tirjax.testing.reference import mt_grpo, otb_gdpo

REFERENCES = {**group.REFERENCES, **portool.REFERENCES, **matching.REFERENCES,
              **verl_baselines.REFERENCES, **agentic.REFERENCES, **oracle.REFERENCES,
              **otb_gdpo.REFERENCES, **mt_grpo.REFERENCES}
