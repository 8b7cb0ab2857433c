"""Independent reference implementations, written from the spec (one module per topic).

For the advantage estimators, `REFERENCES[name](batch, **options)` returns
`dict(steps=[B, T], rows=[B])`, with `batch` the numpy arrays of a `Rollouts`
(`{f.name: np.asarray(getattr(r, f.name))}`, call encodings under `calls.<field>`) and
`options` the fields of the estimator's options dataclass (same names and defaults). Plain
Python loops and dicts over groups, trees and rows: slow on purpose, never sharing code with
the kernels. Each estimator's registration names its reference (`register(...,
reference="tirjax.testing.reference.<module>:<function>")`); `REFERENCES` reads them from the
registry. Addition folders join this package as they join `tirjax.advantages`
(`tirjax.plugin_path`).
"""

from __future__ import annotations

from collections.abc import Mapping

from tirjax import plugin_path

__path__ = plugin_path.extend(__path__, __name__)


class _Registered(Mapping):
  """Name -> reference of every registered estimator, read from the registry on each lookup
  (so an estimator registered later is there too)."""

  def __getitem__(self, name):
    from tirjax import advantages  # noqa: PLC0415  (the references never need the kernels)
    if name not in advantages.names():
      raise KeyError(name)
    return advantages.get(name).reference_fn

  def __iter__(self):
    from tirjax import advantages  # noqa: PLC0415
    return iter(advantages.names())

  def __len__(self):
    from tirjax import advantages  # noqa: PLC0415
    return len(advantages.names())


REFERENCES = _Registered()
