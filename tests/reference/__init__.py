"""Independent reference implementations, by estimator name (see each module's docstring).

`REFERENCES[name](batch, **options) -> dict(steps=[B, T], rows=[B])`, with `batch` the
`Rollouts` fields as numpy arrays (call encodings under `calls.<field>`).
"""

from tests.reference import matching

REFERENCES = {**matching.REFERENCES}
