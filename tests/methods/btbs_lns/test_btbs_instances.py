"""btbs_lns.instances: seeded generators, a known feasible point per family, the MIP checks and
the MPS writer."""
import numpy as np
import pytest

from jaxlab.methods.btbs_lns import instances

SMALL = {"setcover": dict(num_rows=30, num_cols=60, density=0.1),
         "cauctions": dict(num_items=20, num_bids=50),
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
  # A packing accepts nothing feasibly; accepting every bid sells some item twice.
  broken = np.ones if family == "cauctions" else np.zeros
  assert not mip.is_feasible(broken(mip.num_cols))


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


def test_cauctions_bids_are_distinct_nonempty_bundles_and_the_mip_packs_them():
  bids = instances.auction_bids(0, **SMALL["cauctions"])
  mip = instances.cauctions(0, **SMALL["cauctions"])
  assert len(bids.bundles) == mip.num_cols == 50
  assert all(len(b) >= 1 for b in bids.bundles)
  assert len({tuple(b) for b in bids.bundles}) == len(bids.bundles)
  assert all(np.all(np.diff(b) > 0) and b[0] >= 0 and b[-1] < 20 for b in bids.bundles)
  np.testing.assert_array_equal(mip.c, -bids.prices)
  assert bids.prices.min() >= 0 and mip.name == "cauctions-0"
  dense = mip.dense()
  used = np.unique(np.concatenate(bids.bundles))
  assert mip.num_rows == len(used) + bids.num_dummy_items
  for k, bundle in enumerate(bids.bundles):      # column k: its items' rows, then its dummy row
    expected = np.zeros(mip.num_rows)
    expected[np.searchsorted(used, bundle)] = 1
    if bids.xor_group[k] >= 0:
      expected[len(used) + bids.xor_group[k]] = 1
    np.testing.assert_array_equal(dense[:, k], expected)
  assert np.all(dense.sum(axis=1) >= 1)          # no empty row
  assert np.all(np.isneginf(mip.row_lower)) and np.all(mip.row_upper == 1)
  assert np.all(mip.col_upper == 1) and np.all(mip.integrality)
  # A bidder's bids share one dummy item exactly when it placed more than two.
  for who in np.unique(bids.bidder):
    groups = bids.xor_group[bids.bidder == who]
    assert len(set(groups)) == 1 and (groups[0] >= 0) == (len(groups) > 2)


def test_cauctions_greedy_point_sells_something_and_arguments_are_checked():
  mip = instances.cauctions(1, **SMALL["cauctions"])
  x = instances.known_feasible_point(mip, "cauctions")
  assert mip.is_feasible(x) and mip.objective(x) < 0 and x.sum() >= 1
  for bad in (dict(num_items=1), dict(num_bids=0), dict(add_item_prob=1.5),
              dict(min_value=5, max_value=1), dict(num_items=3, num_bids=8)):
    with pytest.raises(ValueError, match="cauctions"):
      instances.cauctions(0, **{**SMALL["cauctions"], **bad})


def _read_mps(path):
  """A minimal free-MPS reader (the subset `write_mps` writes) back to dense arrays."""
  section, kinds, names = None, {}, {}
  entries, c, rhs, ranges, bounds, integer = [], {}, {}, {}, {}, set()
  in_integers = False
  for line in path.read_text().splitlines():
    if not line.startswith(" "):
      section = line.split()[0]
      continue
    fields = line.split()
    if section == "ROWS" and fields[1] != "obj":
      kinds[fields[1]] = fields[0]
      names[fields[1]] = len(names)
    elif section == "COLUMNS":
      if fields[1] == "'MARKER'":
        in_integers = fields[2] == "'INTORG'"
        continue
      j = int(fields[0][1:])
      if in_integers:
        integer.add(j)
      if fields[1] == "obj":
        c[j] = float(fields[2])
      else:
        entries.append((names[fields[1]], j, float(fields[2])))
    elif section == "RHS":
      rhs[names[fields[1]]] = float(fields[2])
    elif section == "RANGES":
      ranges[names[fields[1]]] = float(fields[2])
    elif section == "BOUNDS":
      bounds.setdefault(int(fields[2][1:]), []).append((fields[0], fields[3:]))
  m, n = len(names), len(c)
  matrix = np.zeros((m, n))
  for i, j, value in entries:
    matrix[i, j] = value
  lower, upper = np.full(m, -np.inf), np.full(m, np.inf)
  for name, i in names.items():
    if kinds[name] in ("G", "E"):
      lower[i] = rhs.get(i, 0.0)
    if kinds[name] in ("L", "E"):
      upper[i] = rhs.get(i, 0.0)
    if i in ranges:
      upper[i] = lower[i] + ranges[i]
  col_lower, col_upper = np.zeros(n), np.full(n, np.inf)
  for j, items in bounds.items():
    for kind, value in items:
      if kind == "LO":
        col_lower[j] = float(value[0])
      elif kind == "UP":
        col_upper[j] = float(value[0])
      elif kind == "FX":
        col_lower[j] = col_upper[j] = float(value[0])
      elif kind == "MI":
        col_lower[j] = -np.inf
  integrality = np.zeros(n, bool)
  integrality[sorted(integer)] = True
  return (np.asarray([c[j] for j in range(n)]), matrix, lower, upper, col_lower, col_upper,
          integrality)


@pytest.mark.parametrize("family", instances.FAMILIES)
def test_mps_round_trips(family, tmp_path):
  mip = instances.generate(family, 0, **SMALL[family])
  path = tmp_path / f"{family}.mps"
  mip.write_mps(path)
  c, matrix, lower, upper, col_lower, col_upper, integrality = _read_mps(path)
  np.testing.assert_array_equal(c, mip.c)
  np.testing.assert_array_equal(matrix, mip.dense())
  np.testing.assert_array_equal(lower, mip.row_lower)
  np.testing.assert_array_equal(upper, mip.row_upper)
  np.testing.assert_array_equal(col_lower, mip.col_lower)
  np.testing.assert_array_equal(col_upper, mip.col_upper)
  np.testing.assert_array_equal(integrality, mip.integrality)


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
    instances.generate("knapsack", 0)
