"""btbs_lns.instances: seeded generators, a known feasible point per family, the MIP checks and
the MPS writer."""
import numpy as np
import pytest

from jaxlab.methods.btbs_lns import instances

SMALL = {"setcover": dict(num_rows=30, num_cols=60, density=0.1),
         "facility": dict(num_customers=6, num_facilities=5),
         "intcover": dict(num_rows=20, num_cols=40, density=0.2)}


@pytest.mark.parametrize("family", instances.FAMILIES)
def test_the_same_seed_gives_the_same_instance_and_another_seed_another(family):
  a = instances.generate(family, 3, **SMALL[family])
  b = instances.generate(family, 3, **SMALL[family])
  c = instances.generate(family, 4, **SMALL[family])
  for field in ("c", "indptr", "indices", "data", "row_lower", "col_upper"):
    np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
  assert not np.array_equal(a.c, c.c)


@pytest.mark.parametrize("family", instances.FAMILIES)
def test_a_known_point_is_feasible_and_a_broken_one_is_not(family):
  mip = instances.generate(family, 0, **SMALL[family])
  x = instances.known_feasible_point(mip, family)
  assert mip.is_feasible(x), mip.violations(x)
  assert np.isclose(mip.objective(x), mip.c @ x)
  np.testing.assert_allclose(mip.activity(x), mip.dense() @ x)
  assert not mip.is_feasible(np.zeros(mip.num_cols))


def test_setcover_rows_have_two_columns_and_every_column_covers_a_row():
  mip = instances.setcover(0, **SMALL["setcover"])
  dense = mip.dense()
  assert dense.sum(axis=1).min() >= 2 and dense.sum(axis=0).min() >= 1
  assert set(np.unique(dense)) <= {0.0, 1.0}


def test_intcover_ranges_match_the_issue():
  mip = instances.intcover(1, **SMALL["intcover"])
  assert mip.col_upper.min() >= 5 and mip.col_upper.max() <= 100
  assert mip.data.min() >= 1 and mip.data.max() <= 10
  assert mip.row_lower.max() <= 200 and np.all(mip.integrality)
  assert mip.violations(np.full(mip.num_cols, 0.5))["integrality"] == mip.num_cols


def test_mps_has_every_section_integer_markers_and_bounds(tmp_path):
  mip = instances.facility(0, **SMALL["facility"])
  path = tmp_path / "f.mps"
  mip.write_mps(path)
  text = path.read_text()
  for section in ("ROWS", "COLUMNS", "RHS", "BOUNDS", "ENDATA"):
    assert f"\n{section}" in text
  assert text.count("'INTORG'") == 1 and text.count("'INTEND'") == 1
  rows = [line for line in text.splitlines() if line.startswith((" G r", " L r", " E r"))]
  assert len(rows) == mip.num_rows
  assert f" UP bnd x{mip.num_cols - 1} 1" in text


def test_bits_and_bad_families():
  assert instances.bits_needed(0, 1) == 1
  assert instances.bits_needed(0, 100) == 7
  assert instances.bits_needed(5, 5) == 0
  with pytest.raises(ValueError, match="unknown family"):
    instances.generate("cauctions", 0)
