"""Seeded MIP instance generators and the one `MIP` container every solver interface reads.

Families (numpy, seeded; `generate(family, seed, **size)`):

* `setcover` (Balas & Ho, as learn2branch generates it): m rows, n columns, a density of
  nonzeros; every row is covered by at least two columns and every column covers a row; costs
  uniform in 1..100. min c.x, A x >= 1, x binary.
* `cauctions` (combinatorial auction, the "arbitrary relationships" distribution of
  Leyton-Brown, Pearson & Shoham 2000, section 4.3, as learn2branch draws it): items with common
  (resale) values in 1..100 and a random symmetric compatibility between every two items; each
  bidder has private interests in the items and private values (common value +- 50 by interest),
  grows one bundle item by item (first item by interest, then with probability 0.7 another one,
  chosen by interest times mean compatibility with the bundle) priced at the sum of its private
  values plus |bundle|^1.2, then up to 5 substitutable bundles of the same size sharing an item
  with it (kept when priced within 1.5 times the first bid and worth at least half its resale
  value); a bidder's bids exclude each other through a dummy item when there are more than two.
  Bids on a bundle that is already bid on are dropped. max price.x, sum of the bids holding an
  item <= 1, x binary, written as min -price.x with one row per item that is bid on and one per
  dummy item.
* `facility` (capacitated facility location, Cornuejols et al., as learn2branch): customers with
  demands 5..35, facilities with capacities 10..160 scaled so the total capacity is `ratio` times
  the demand, fixed costs depending on capacity, transport costs from distances on the unit
  square. Variables x_ij in [0, 1] (share of customer i served by j) and y_j binary:
  sum_j x_ij >= 1, sum_i d_i x_ij <= s_j y_j, sum_j s_j y_j >= sum_i d_i, x_ij <= y_j.
* `intcover`: a general-integer multicover, min c.x, A x >= b, a_ij in 1..10 at the given
  density, b_i in 20..200, 0 <= x_j <= U_j, U_j in 5..100, c_j in 1..100; b is capped so that
  x = U is feasible.

`MIP` holds c, a CSR constraint matrix, row bounds (row_lower <= A x <= row_upper, +-inf for
one-sided rows), column bounds and integrality, with a NumPy feasibility check and a free-MPS
writer; `to_scip` / `to_highs` come with the solver interfaces.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

FAMILIES = ("setcover", "cauctions", "facility", "intcover")


@dataclasses.dataclass(frozen=True)
class MIP:
  """min c.x s.t. row_lower <= A x <= row_upper, col_lower <= x <= col_upper, x_j integer
  where `integrality`. A in CSR form: `indptr` [m + 1], `indices` [nnz], `data` [nnz]."""
  name: str
  c: np.ndarray
  indptr: np.ndarray
  indices: np.ndarray
  data: np.ndarray
  row_lower: np.ndarray
  row_upper: np.ndarray
  col_lower: np.ndarray
  col_upper: np.ndarray
  integrality: np.ndarray

  def __post_init__(self):
    m, n = self.num_rows, self.num_cols
    for name, array, size in (("indptr", self.indptr, m + 1), ("row_upper", self.row_upper, m),
                              ("col_lower", self.col_lower, n), ("col_upper", self.col_upper, n),
                              ("integrality", self.integrality, n)):
      if np.shape(array) != (size,):
        raise ValueError(f"MIP {self.name}: {name} has shape {np.shape(array)}, expected "
                         f"({size},)")
    if self.indices.size and (self.indices.min() < 0 or self.indices.max() >= n):
      raise ValueError(f"MIP {self.name}: column indices outside 0..{n - 1}")

  @property
  def num_rows(self) -> int:
    return int(self.row_lower.shape[0])

  @property
  def num_cols(self) -> int:
    return int(self.c.shape[0])

  def dense(self) -> np.ndarray:
    """A as a dense [m, n] array (small instances and tests)."""
    matrix = np.zeros((self.num_rows, self.num_cols))
    rows = np.repeat(np.arange(self.num_rows), np.diff(self.indptr))
    np.add.at(matrix, (rows, self.indices), self.data)
    return matrix

  def activity(self, x: np.ndarray) -> np.ndarray:
    """A x [m], from the CSR arrays."""
    rows = np.repeat(np.arange(self.num_rows), np.diff(self.indptr))
    return np.bincount(rows, weights=self.data * np.asarray(x, float)[self.indices],
                       minlength=self.num_rows)

  def objective(self, x: np.ndarray) -> float:
    return float(np.dot(self.c, x))

  def violations(self, x: np.ndarray, tol: float = 1e-6) -> dict[str, int]:
    """Counts of violated rows, bounds and integrality at `x` (all 0: feasible)."""
    x = np.asarray(x, float)
    activity = self.activity(x)
    integral = np.abs(x - np.round(x)) <= tol
    return {"rows": int(np.sum((activity < self.row_lower - tol)
                               | (activity > self.row_upper + tol))),
            "bounds": int(np.sum((x < self.col_lower - tol) | (x > self.col_upper + tol))),
            "integrality": int(np.sum(self.integrality & ~integral))}

  def is_feasible(self, x: np.ndarray, tol: float = 1e-6) -> bool:
    return not any(self.violations(x, tol).values())

  def write_mps(self, path: str | os.PathLike) -> None:
    """Free-format MPS (ROWS, COLUMNS with integer markers, RHS, RANGES, BOUNDS)."""
    m = self.num_rows
    kinds, rhs, ranges = [], {}, {}
    for i in range(m):
      low, high = self.row_lower[i], self.row_upper[i]
      if np.isfinite(low) and np.isfinite(high):
        kinds.append("E" if low == high else "G")
        rhs[i] = low
        if low != high:
          ranges[i] = high - low
      elif np.isfinite(low):
        kinds.append("G")
        rhs[i] = low
      elif np.isfinite(high):
        kinds.append("L")
        rhs[i] = high
      else:
        kinds.append("N")
    columns = [[] for _ in range(self.num_cols)]
    for i in range(m):
      for k in range(self.indptr[i], self.indptr[i + 1]):
        columns[self.indices[k]].append((i, self.data[k]))
    lines = [f"NAME {self.name}", "ROWS", " N obj"]
    lines += [f" {kind} r{i}" for i, kind in enumerate(kinds)]
    lines.append("COLUMNS")
    in_integers = False
    for j in range(self.num_cols):
      if bool(self.integrality[j]) != in_integers:
        marker = "INTORG" if not in_integers else "INTEND"
        lines.append(f" M{j} 'MARKER' '{marker}'")
        in_integers = not in_integers
      lines.append(f" x{j} obj {self.c[j]:.17g}")
      lines += [f" x{j} r{i} {value:.17g}" for i, value in columns[j]]
    if in_integers:
      lines.append(" Mend 'MARKER' 'INTEND'")
    lines.append("RHS")
    lines += [f" rhs r{i} {value:.17g}" for i, value in rhs.items()]
    if ranges:
      lines.append("RANGES")
      lines += [f" rng r{i} {value:.17g}" for i, value in ranges.items()]
    lines.append("BOUNDS")
    for j in range(self.num_cols):
      low, high = self.col_lower[j], self.col_upper[j]
      if low == high:
        lines.append(f" FX bnd x{j} {low:.17g}")
        continue
      lines.append(f" LO bnd x{j} {low:.17g}" if np.isfinite(low) else f" MI bnd x{j}")
      if np.isfinite(high):
        lines.append(f" UP bnd x{j} {high:.17g}")
      else:
        lines.append(f" PL bnd x{j}")
    lines.append("ENDATA")
    with open(path, "w", encoding="ascii") as f:
      f.write("\n".join(lines) + "\n")


def _csr(rows: list[np.ndarray], values: list[np.ndarray]) -> tuple[np.ndarray, ...]:
  indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])]).astype(np.int64)
  indices = np.concatenate(rows).astype(np.int64) if rows else np.zeros(0, np.int64)
  data = np.concatenate(values).astype(float) if values else np.zeros(0)
  return indptr, indices, data


def setcover(seed: int, num_rows: int = 500, num_cols: int = 1000, density: float = 0.05
             ) -> MIP:
  """Balas & Ho's set cover as learn2branch draws it (see the module doc)."""
  if num_cols < 2 or num_rows < 1 or not 0 < density <= 1:
    raise ValueError(f"setcover needs num_cols >= 2, num_rows >= 1, density in (0, 1], got "
                     f"{num_rows}x{num_cols}, {density}")
  rng = np.random.default_rng(seed)
  target = int(num_rows * num_cols * density)
  # (row, column) nonzeros: every column covers a random row, every row two distinct random
  # columns, and uniform pairs up to the density (duplicates merge).
  pairs_rows = [rng.integers(0, num_rows, num_cols), np.repeat(np.arange(num_rows), 2)]
  pairs_cols = [np.arange(num_cols),
                np.concatenate([rng.choice(num_cols, 2, replace=False)
                                for _ in range(num_rows)])]
  extra = max(target - num_cols - 2 * num_rows, 0)
  pairs_rows.append(rng.integers(0, num_rows, extra))
  pairs_cols.append(rng.integers(0, num_cols, extra))
  rows, cols = np.concatenate(pairs_rows), np.concatenate(pairs_cols)
  members = [np.unique(cols[rows == i]) for i in range(num_rows)]
  indptr, indices, data = _csr(members, [np.ones(len(m)) for m in members])
  return MIP(name=f"setcover-{seed}", c=rng.integers(1, 101, num_cols).astype(float),
             indptr=indptr, indices=indices, data=data, row_lower=np.ones(num_rows),
             row_upper=np.full(num_rows, np.inf), col_lower=np.zeros(num_cols),
             col_upper=np.ones(num_cols), integrality=np.ones(num_cols, bool))


@dataclasses.dataclass(frozen=True)
class AuctionBids:
  """The bids of a combinatorial auction: `bundles[k]` the sorted items of bid k (real items
  0..num_items - 1), `prices[k]` what it pays, `bidder[k]` who placed it and `xor_group[k]` the
  dummy item its bidder's bids share (-1 for a bidder with at most two bids, which always overlap
  anyway)."""
  num_items: int
  bundles: tuple[np.ndarray, ...]
  prices: np.ndarray
  bidder: np.ndarray
  xor_group: np.ndarray

  @property
  def num_dummy_items(self) -> int:
    return int(self.xor_group.max()) + 1 if self.xor_group.size else 0


def _draw_weighted(rng: np.random.Generator, weights: np.ndarray) -> int:
  """An index drawn with probability proportional to the nonnegative `weights` (some positive)."""
  cumulative = np.cumsum(weights)
  total = cumulative[-1]
  if not total > 0:
    raise ValueError("no item left to draw")
  index = int(np.searchsorted(cumulative, rng.random() * total, side="right"))
  if index >= weights.shape[0]:                      # u * total rounded up to total
    index = int(np.flatnonzero(weights > 0)[-1])
  return index


def auction_bids(seed: int, num_items: int = 100, num_bids: int = 500, min_value: float = 1.0,
                 max_value: float = 100.0, value_deviation: float = 0.5,
                 add_item_prob: float = 0.7, max_sub_bids: int = 5, additivity: float = 0.2,
                 budget_factor: float = 1.5, resale_factor: float = 0.5,
                 integer_prices: bool = False) -> AuctionBids:
  """The bids of `cauctions` (see there and the module doc)."""
  if (num_items < 2 or num_bids < 1 or not 0 <= min_value <= max_value
      or value_deviation < 0 or not 0 <= add_item_prob <= 1 or max_sub_bids < 0
      or budget_factor < 0 or resale_factor < 0):
    raise ValueError(f"cauctions needs num_items >= 2, num_bids >= 1, 0 <= min_value <= "
                     f"max_value, value_deviation >= 0, add_item_prob in [0, 1], max_sub_bids "
                     f">= 0, budget_factor >= 0, resale_factor >= 0, got {num_items} items, "
                     f"{num_bids} bids, values {min_value}..{max_value}, deviation "
                     f"{value_deviation}, add_item_prob {add_item_prob}, max_sub_bids "
                     f"{max_sub_bids}, budget_factor {budget_factor}, resale_factor "
                     f"{resale_factor}")
  if num_items < 60 and num_bids > 2 ** num_items - 1:
    raise ValueError(f"cauctions: {num_bids} distinct bundles of {num_items} items do not exist")
  rng = np.random.default_rng(seed)
  n = num_items
  common = min_value + (max_value - min_value) * rng.random(n)        # resale values
  upper = np.triu(rng.random((n, n)), k=1)
  compat = upper + upper.T                                            # symmetric, zero diagonal
  compat = compat / compat.sum(axis=0, keepdims=True)   # column-normalised, as learn2branch

  def grow(first: int, size: int | None, interests: np.ndarray) -> np.ndarray:
    """A bundle from `first`: up to `size` items, or (size None) another item with probability
    add_item_prob each time; the next item drawn by interest times the summed (so, up to a
    constant, mean) compatibility with the items already in."""
    members = np.zeros(n, bool)
    members[first] = True
    affinity = compat[first].copy()
    count = 1
    while count < n and (count < size if size is not None else rng.random() < add_item_prob):
      weights = np.where(members, 0.0, interests * affinity)
      if not weights.sum() > 0:                           # degenerate: any open item
        weights = (~members).astype(float)
      item = _draw_weighted(rng, weights)
      members[item] = True
      affinity += compat[item]
      count += 1
    return np.flatnonzero(members)

  def price_of(bundle: np.ndarray, private: np.ndarray) -> float:
    price = float(private[bundle].sum() + len(bundle) ** (1 + additivity))
    return float(math.floor(price)) if integer_prices else price

  bundles, prices, bidders, groups = [], [], [], []
  seen: set[bytes] = set()
  num_groups = 0
  bidder = 0
  draws_left = 100 * num_bids + 1000
  while len(bundles) < num_bids:
    draws_left -= 1
    if draws_left < 0:
      raise ValueError(f"cauctions could not draw {num_bids} distinct bundles of {num_items} "
                       f"items (add_item_prob {add_item_prob}); ask for fewer bids")
    interests = rng.random(n)
    private = common + max_value * value_deviation * (2 * interests - 1)
    first = grow(_draw_weighted(rng, interests), None, interests)
    first_price = price_of(first, private)
    if first_price < 0 or first.tobytes() in seen:        # a bidder with no usable first bid
      continue
    own = [(first, first_price)]
    own_keys = {first.tobytes()}
    candidates = [grow(int(item), len(first), interests) for item in first]
    candidate_prices = np.asarray([price_of(b, private) for b in candidates])
    budget = budget_factor * first_price
    min_resale = resale_factor * common[first].sum()
    for k in np.argsort(-candidate_prices, kind="stable"):
      if len(own) >= max_sub_bids + 1 or len(bundles) + len(own) >= num_bids:
        break
      bundle, price = candidates[k], float(candidate_prices[k])
      key = bundle.tobytes()
      if (price < 0 or price > budget or common[bundle].sum() < min_resale
          or key in own_keys or key in seen):
        continue
      own.append((bundle, price))
      own_keys.add(key)
    group = -1
    if len(own) > 2:
      group, num_groups = num_groups, num_groups + 1
    for bundle, price in own:
      bundles.append(bundle)
      prices.append(price)
      bidders.append(bidder)
      groups.append(group)
    seen |= own_keys
    bidder += 1
  return AuctionBids(num_items=n, bundles=tuple(bundles), prices=np.asarray(prices, float),
                     bidder=np.asarray(bidders, np.int64), xor_group=np.asarray(groups, np.int64))


def cauctions(seed: int, num_items: int = 100, num_bids: int = 500, min_value: float = 1.0,
              max_value: float = 100.0, value_deviation: float = 0.5,
              add_item_prob: float = 0.7, max_sub_bids: int = 5, additivity: float = 0.2,
              budget_factor: float = 1.5, resale_factor: float = 0.5,
              integer_prices: bool = False) -> MIP:
  """Combinatorial auction, Leyton-Brown, Pearson & Shoham's "arbitrary relationships"
  distribution (EC 2000, section 4.3) drawn as learn2branch (Gasse et al. 2019) draws it, with
  its defaults (100 items, 500 bids, add_item_prob 0.7 as its instance script passes), written
  anew; see the module doc and `auction_bids` for the bids themselves.

  Columns are the bids in the order they were placed (x_k = 1: bid k is accepted), c = -price;
  rows are the items some bid holds, in item order, then one row per dummy item (a bidder with
  more than two bids: at most one of them is accepted); every row sum x <= 1, x binary.

  Where this differs from learn2branch's code: (1) the next item of a bundle is drawn by
  interest times the mean compatibility with the items already in the bundle, as the paper
  describes (learn2branch indexes the compatibility rows with an integer 0/1 mask, which averages
  rows 0 and 1 instead of the bundle's); (2) a bid on a bundle that another bidder already bids
  on is dropped too (learn2branch only drops a bidder's own duplicates): a bidder whose first
  bundle is taken is redrawn, a taken substitutable bundle is skipped, so all bundles differ;
  (3) with `integer_prices` a price is floored (learn2branch truncates; the same for the
  nonnegative prices that are kept).
  """
  bids = auction_bids(seed, num_items, num_bids, min_value=min_value, max_value=max_value,
                      value_deviation=value_deviation, add_item_prob=add_item_prob,
                      max_sub_bids=max_sub_bids, additivity=additivity,
                      budget_factor=budget_factor, resale_factor=resale_factor,
                      integer_prices=integer_prices)
  num_cols = len(bids.bundles)
  items = np.concatenate(bids.bundles)
  item_bids = np.repeat(np.arange(num_cols), [len(b) for b in bids.bundles])
  used = np.unique(items)                                  # items some bid holds, one row each
  in_group = np.flatnonzero(bids.xor_group >= 0)
  rows = np.concatenate([np.searchsorted(used, items), len(used) + bids.xor_group[in_group]])
  cols = np.concatenate([item_bids, in_group])
  order = np.lexsort((cols, rows))
  num_rows = len(used) + bids.num_dummy_items
  indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=num_rows))])
  return MIP(name=f"cauctions-{seed}", c=-bids.prices, indptr=indptr.astype(np.int64),
             indices=cols[order].astype(np.int64), data=np.ones(len(order)),
             row_lower=np.full(num_rows, -np.inf), row_upper=np.ones(num_rows),
             col_lower=np.zeros(num_cols), col_upper=np.ones(num_cols),
             integrality=np.ones(num_cols, bool))


def facility(seed: int, num_customers: int = 100, num_facilities: int = 100,
             ratio: float = 5.0) -> MIP:
  """Capacitated facility location (Cornuejols et al.; learn2branch's procedure). Columns:
  x_ij (customer-major, i * F + j) then y_j."""
  rng = np.random.default_rng(seed)
  n_c, n_f = num_customers, num_facilities
  c_x, c_y = rng.random(n_c), rng.random(n_c)
  f_x, f_y = rng.random(n_f), rng.random(n_f)
  demand = rng.integers(5, 36, n_c).astype(float)
  capacity = rng.integers(10, 161, n_f).astype(float)
  fixed = (rng.integers(100, 111, n_f) * np.sqrt(capacity)
           + rng.integers(0, 91, n_f)).astype(float)
  capacity = capacity * ratio * demand.sum() / capacity.sum()
  distance = np.sqrt((c_x[:, None] - f_x[None]) ** 2 + (c_y[:, None] - f_y[None]) ** 2)
  transport = distance * 10 * demand[:, None]
  x = lambda i, j: i * n_f + j
  y = lambda j: n_c * n_f + j
  rows, values, lower, upper = [], [], [], []
  for i in range(n_c):                                   # demand met
    rows.append(np.asarray([x(i, j) for j in range(n_f)]))
    values.append(np.ones(n_f))
    lower.append(1.0)
    upper.append(np.inf)
  for j in range(n_f):                                   # capacity of an open facility
    rows.append(np.asarray([x(i, j) for i in range(n_c)] + [y(j)]))
    values.append(np.concatenate([demand, [-capacity[j]]]))
    lower.append(-np.inf)
    upper.append(0.0)
  rows.append(np.asarray([y(j) for j in range(n_f)]))    # enough capacity opened (a cut)
  values.append(capacity)
  lower.append(demand.sum())
  upper.append(np.inf)
  for i in range(n_c):                                   # serve only from open facilities
    for j in range(n_f):
      rows.append(np.asarray([x(i, j), y(j)]))
      values.append(np.asarray([1.0, -1.0]))
      lower.append(-np.inf)
      upper.append(0.0)
  indptr, indices, data = _csr(rows, values)
  num_cols = n_c * n_f + n_f
  return MIP(name=f"facility-{seed}", c=np.concatenate([transport.reshape(-1), fixed]),
             indptr=indptr, indices=indices, data=data, row_lower=np.asarray(lower),
             row_upper=np.asarray(upper), col_lower=np.zeros(num_cols),
             col_upper=np.ones(num_cols),
             integrality=np.concatenate([np.zeros(n_c * n_f, bool), np.ones(n_f, bool)]))


def intcover(seed: int, num_rows: int = 500, num_cols: int = 1000, density: float = 0.05
             ) -> MIP:
  """The general-integer multicover of the module doc."""
  rng = np.random.default_rng(seed)
  upper = rng.integers(5, 101, num_cols).astype(float)
  members, values = [], []
  per_row = max(1, int(round(density * num_cols)))
  for _ in range(num_rows):
    members.append(np.sort(rng.choice(num_cols, per_row, replace=False)))
    values.append(rng.integers(1, 11, per_row).astype(float))
  indptr, indices, data = _csr(members, values)
  demand = rng.integers(20, 201, num_rows).astype(float)
  reachable = np.asarray([np.dot(v, upper[m]) for m, v in zip(members, values)])
  demand = np.minimum(demand, reachable)
  return MIP(name=f"intcover-{seed}", c=rng.integers(1, 101, num_cols).astype(float),
             indptr=indptr, indices=indices, data=data, row_lower=demand,
             row_upper=np.full(num_rows, np.inf), col_lower=np.zeros(num_cols),
             col_upper=upper, integrality=np.ones(num_cols, bool))


GENERATORS = {"setcover": setcover, "cauctions": cauctions, "facility": facility,
              "intcover": intcover}


def generate(family: str, seed: int, **size) -> MIP:
  if family not in GENERATORS:
    raise ValueError(f"unknown family {family!r}; choose one of {', '.join(FAMILIES)}")
  return GENERATORS[family](seed, **size)


def known_feasible_point(mip: MIP, family: str) -> np.ndarray:
  """A point every instance of the family satisfies by construction (for tests)."""
  if family in ("setcover", "intcover"):
    return mip.col_upper.copy()                     # all ones / every x_j at U_j
  if family == "cauctions":
    # Greedy packing: the highest-priced bids first, each kept when it shares no item (row) with a
    # bid already kept.
    rows = np.repeat(np.arange(mip.num_rows), np.diff(mip.indptr))
    by_col = np.argsort(mip.indices, kind="stable")
    col_ptr = np.concatenate([[0], np.cumsum(np.bincount(mip.indices,
                                                         minlength=mip.num_cols))])
    col_rows = rows[by_col]
    taken = np.zeros(mip.num_rows, bool)
    x = np.zeros(mip.num_cols)
    for j in np.argsort(mip.c, kind="stable"):
      if mip.c[j] >= 0:
        break
      held = col_rows[col_ptr[j]:col_ptr[j + 1]]
      if not taken[held].any():
        taken[held] = True
        x[j] = 1.0
    return x
  if family == "facility":
    # Open every facility and split each customer over them by capacity share.
    n_f = int(np.sum(mip.integrality))
    n_c = (mip.num_cols - n_f) // n_f
    capacity_row = mip.num_rows - n_c * n_f - 1     # the row sum_j s_j y_j >= D
    start, stop = mip.indptr[capacity_row], mip.indptr[capacity_row + 1]
    capacity = mip.data[start:stop]
    share = np.tile(capacity / capacity.sum(), n_c)
    return np.concatenate([share, np.ones(n_f)])
  raise ValueError(f"unknown family {family!r}")


def bits_needed(lower: float, upper: float) -> int:
  """d = ceil(log2(u - l + 1)) virtual bits of an integer in [l, u] (0 for a fixed one)."""
  return int(math.ceil(math.log2(upper - lower + 1))) if upper > lower else 0
