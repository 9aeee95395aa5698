"""The tripartite graph the policy reads (reconstructed feature set; unverified against the paper).

Nodes: the variables, the constraints and one objective node. Edges: variable-constraint (A_ij
over the row's largest |a|), variable-objective (c_j over max |c|) and constraint-objective (the
row's right-hand side as a share of its reachable activity range).

* Variables [n, VAR_FEATURES]: binary / general integer / continuous, log2 of the range (over 8),
  cost, LP value (as a share of the range), LP fractionality, reduced cost, degree, the
  incumbent's value (share of the range), its distance to the LP value, and whether it sits at
  a bound. (The neighbourhood is not a node feature: the branch head reads it, `policy`.)
* Constraints [m, CON_FEATURES]: >= / <= / both, right-hand side, the incumbent's slack, tight at
  the incumbent, the LP dual.
* Objective [1, OBJ_FEATURES]: a constant and the incumbent's gap to the LP bound.
* Bits [n, max_bits, BIT_FEATURES]: position, bits below, the incumbent's bit and the rounded LP
  value's bit (binarized tightening acts on these virtual variables).

`StaticFeatures.of(mip, lp)` computes the incumbent-free part once per instance; `graph_at(static,
x)` adds the incumbent's. `pad(graph, bucket)` pads every array to a size bucket (powers of two)
so one compiled policy serves every instance of a family; padding rows and edges are masked.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import numpy as np

from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import solvers
from jaxlab.methods.btbs_lns import tightening

VAR_FEATURES = 12
CON_FEATURES = 7
OBJ_FEATURES = 2
BIT_FEATURES = 4


class Graph(NamedTuple):
  """Padded arrays of one instance at one incumbent (see the module doc)."""
  variables: np.ndarray      # [N, VAR_FEATURES]
  constraints: np.ndarray    # [M, CON_FEATURES]
  objective: np.ndarray      # [1, OBJ_FEATURES]
  bits: np.ndarray           # [N, D, BIT_FEATURES]
  bit_mask: np.ndarray       # [N, D] the virtual variables of integer variables
  edge_var: np.ndarray       # [E] variable index of each var-con edge
  edge_con: np.ndarray       # [E] constraint index
  edge_coef: np.ndarray      # [E, 1]
  edge_mask: np.ndarray      # [E]
  var_obj: np.ndarray        # [N, 1] the var-objective edge features
  con_obj: np.ndarray        # [M, 1] the con-objective edge features
  var_mask: np.ndarray       # [N]
  con_mask: np.ndarray       # [M]


def _share(values: np.ndarray, lower: np.ndarray, span: np.ndarray) -> np.ndarray:
  return np.clip((values - np.where(np.isfinite(lower), lower, 0.0)) / span, -1.0, 2.0)


@dataclasses.dataclass(frozen=True)
class StaticFeatures:
  """What does not depend on the incumbent, for one instance."""
  mip: instances.MIP
  variables: np.ndarray        # [n, 9] the static variable columns
  con_sense: np.ndarray        # [m, 3]
  con_rhs: np.ndarray          # [m] right-hand side of the row's binding side
  con_scale: np.ndarray        # [m] reachable activity range of the row
  con_dual: np.ndarray         # [m]
  edge_rows: np.ndarray        # [nnz]
  edge_coef: np.ndarray        # [nnz]
  span: np.ndarray             # [n] the range of each variable (1 if unbounded or fixed)
  num_bits: np.ndarray         # [n] virtual bits (0 for continuous or fixed variables)
  lp_bits: np.ndarray          # [n, D]
  lp_x: np.ndarray
  lp_objective: float
  max_bits: int

  @classmethod
  def of(cls, mip: instances.MIP, lp: solvers.LpRelaxation, max_bits: int = 8
         ) -> "StaticFeatures":
    lower, upper = mip.col_lower, mip.col_upper
    finite = np.isfinite(lower) & np.isfinite(upper)
    span = np.where(finite & (upper > lower), upper - lower, 1.0)
    integer = mip.integrality
    binary = integer & (lower >= 0) & (upper <= 1)
    cost_scale = max(float(np.abs(mip.c).max(initial=0.0)), 1e-9)
    bits = np.where(integer & finite, tightening.num_bits(np.where(finite, lower, 0),
                                                          np.where(finite, upper, 0)), 0)
    if bits.max(initial=0) > max_bits:
      raise ValueError(f"{mip.name}: an integer variable needs {bits.max()} bits, more than "
                       f"max_bits={max_bits}; raise policy.max_bits")
    rows = np.repeat(np.arange(mip.num_rows), np.diff(mip.indptr))
    degree = np.bincount(mip.indices, minlength=mip.num_cols).astype(float)
    lp_share = _share(lp.x, lower, span)
    variables = np.stack([
        binary, integer & ~binary, ~integer, np.log2(span + 1.0) / 8.0, mip.c / cost_scale,
        lp_share, np.abs(lp.x - np.round(lp.x)) * integer,
        np.tanh(lp.reduced_cost / cost_scale), degree / max(degree.max(initial=0.0), 1.0)],
        axis=1).astype(np.float32)
    row_max = np.maximum(np.abs(mip.data), 0)
    scale = np.zeros(mip.num_rows)
    np.maximum.at(scale, rows, row_max)
    scale = np.where(scale > 0, scale, 1.0)
    coef = mip.data / scale[rows]
    reach = np.bincount(rows, weights=np.abs(mip.data) * span[mip.indices],
                        minlength=mip.num_rows)
    reach = np.where(reach > 0, reach, 1.0)
    has_low, has_high = np.isfinite(mip.row_lower), np.isfinite(mip.row_upper)
    rhs = np.where(has_low, mip.row_lower, np.where(has_high, mip.row_upper, 0.0))
    sense = np.stack([has_low & ~has_high, has_high & ~has_low, has_low & has_high], axis=1)
    lp_integer = np.clip(np.round(lp.x), np.where(finite, lower, 0), np.where(finite, upper, 0))
    lp_bits = tightening.encode(np.where(integer & finite, lp_integer, 0),
                                np.where(integer & finite, lower, 0),
                                np.where(integer & finite, upper, 0))
    lp_bits = np.pad(lp_bits, ((0, 0), (0, max_bits - lp_bits.shape[1])))
    return cls(mip=mip, variables=variables, con_sense=sense.astype(np.float32), con_rhs=rhs,
               con_scale=reach, con_dual=np.tanh(lp.row_dual / cost_scale), edge_rows=rows,
               edge_coef=coef.astype(np.float32), span=span, num_bits=bits, lp_bits=lp_bits,
               lp_x=lp.x, lp_objective=lp.objective, max_bits=max_bits)


def incumbent_bits(static: StaticFeatures, x: np.ndarray) -> np.ndarray:
  """[n, D] bits of the incumbent's x - l (0 for continuous variables and padding)."""
  mip, integer = static.mip, static.num_bits > 0
  x = np.where(integer, np.rint(x), 0)
  bits = tightening.encode(x, np.where(integer, mip.col_lower, 0),
                           np.where(integer, mip.col_upper, 0))
  return np.pad(bits, ((0, 0), (0, static.max_bits - bits.shape[1])))


def graph_at(static: StaticFeatures, x: np.ndarray) -> Graph:
  """The unpadded graph of the instance at incumbent `x`."""
  mip = static.mip
  x = np.asarray(x, float)
  lower, upper = mip.col_lower, mip.col_upper
  share = _share(x, lower, static.span)
  at_bound = (np.abs(x - lower) < 1e-6) | (np.abs(x - upper) < 1e-6)
  variables = np.concatenate([
      static.variables,
      np.stack([share, np.abs(share - static.variables[:, 5]), at_bound], axis=1)],
      axis=1).astype(np.float32)
  activity = mip.activity(x)
  slack = np.where(np.isfinite(mip.row_lower), activity - mip.row_lower,
                   np.where(np.isfinite(mip.row_upper), mip.row_upper - activity, 0.0))
  slack = slack / static.con_scale
  constraints = np.concatenate([
      static.con_sense, np.stack([np.tanh(static.con_rhs / static.con_scale), slack,
                                  np.abs(slack) < 1e-9, static.con_dual], axis=1)],
      axis=1).astype(np.float32)
  objective_value = mip.objective(x)
  gap = (objective_value - static.lp_objective) / max(abs(objective_value), 1.0)
  depth = static.max_bits
  position = np.arange(depth)[None].repeat(mip.num_cols, 0)
  bit_mask = position < static.num_bits[:, None]
  bits = np.stack([position / depth, (static.num_bits[:, None] - position) / depth,
                   incumbent_bits(static, x), static.lp_bits], axis=-1) * bit_mask[..., None]
  cost_scale = max(float(np.abs(mip.c).max(initial=0.0)), 1e-9)
  return Graph(
      variables=variables, constraints=constraints,
      objective=np.asarray([[1.0, np.tanh(gap)]], np.float32),
      bits=bits.astype(np.float32), bit_mask=bit_mask, edge_var=mip.indices.astype(np.int32),
      edge_con=static.edge_rows.astype(np.int32), edge_coef=static.edge_coef[:, None],
      edge_mask=np.ones(mip.indices.shape[0], bool),
      var_obj=(mip.c / cost_scale).astype(np.float32)[:, None],
      con_obj=np.tanh(static.con_rhs / static.con_scale).astype(np.float32)[:, None],
      var_mask=np.ones(mip.num_cols, bool), con_mask=np.ones(mip.num_rows, bool))


def bucket_of(graph: Graph) -> tuple[int, int, int]:
  """(N, M, E) rounded up to powers of two (at least 8)."""
  grow = lambda k: max(8, 1 << int(np.ceil(np.log2(max(k, 1)))))
  return (grow(graph.variables.shape[0]), grow(graph.constraints.shape[0]),
          grow(graph.edge_var.shape[0]))


def pad(graph: Graph, bucket: tuple[int, int, int] | None = None) -> Graph:
  """Every array padded to the bucket's sizes; padding is masked out."""
  bucket = bucket or bucket_of(graph)
  sizes = {"N": bucket[0], "M": bucket[1], "E": bucket[2]}
  axis_of = {"variables": "N", "bits": "N", "bit_mask": "N", "var_obj": "N", "var_mask": "N",
             "constraints": "M", "con_obj": "M", "con_mask": "M", "edge_var": "E",
             "edge_con": "E", "edge_coef": "E", "edge_mask": "E"}
  out = {}
  for name, array in graph._asdict().items():
    if name not in axis_of:
      out[name] = array
      continue
    extra = sizes[axis_of[name]] - array.shape[0]
    if extra < 0:
      raise ValueError(f"{name} has {array.shape[0]} rows, more than the bucket's "
                       f"{sizes[axis_of[name]]}")
    out[name] = np.pad(array, [(0, extra)] + [(0, 0)] * (array.ndim - 1))
  return Graph(**out)


def stack(graphs: list[Graph]) -> Graph:
  """Graphs of one bucket stacked on a leading axis (a training batch)."""
  return Graph(*(np.stack(arrays) for arrays in zip(*graphs)))
