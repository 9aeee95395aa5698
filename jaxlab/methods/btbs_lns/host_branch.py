"""The branch head evaluated on the host (NumPy and SciPy), for the LNS loop's per-step call.

Inside the loop every step runs the branch head on a new neighbourhood between two SCIP solves.
As a jitted call it took 0.6 ms a step on the long preset's auctions, three times its warm
microbenchmark: the call's dispatch and XLA's thread pool start cold after each solve. The same
arithmetic on the host is a sparse product and a 3-wide matrix product:

* once per instance, `Incidence.of(graph)`: the 0/1 constraint-variable matrix of the real edges;
* once per incumbent, `BranchHead.prepare(embedding)`: the first layer's product with the trunk's
  embeddings (and its bias), which do not change until a step is accepted;
* every step, `BranchHead.logits(prepared, incidence, released)`: the neighbourhood's context
  (`policy.released_context`, computed here with sparse products), its 3 x hidden share of the
  first layer, the ReLU and the output layer.

`policy.TripartiteNet.branch` stays the definition: training differentiates it, and the tests
check this path against it.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse

from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import policy as policy_lib


@dataclasses.dataclass(frozen=True)
class Incidence:
  """The real constraint-variable edges of one padded graph as sparse 0/1 matrices."""
  rows: scipy.sparse.csr_matrix           # [M, N]
  columns: scipy.sparse.csr_matrix        # [N, M], the transpose in row-major order
  row_size: np.ndarray                    # [M] edges per constraint (at least 1)
  degree: np.ndarray                      # [N] edges per variable (at least 1)
  var_mask: np.ndarray                    # [N]

  @classmethod
  def of(cls, graph: features.Graph) -> "Incidence":
    mask = np.asarray(graph.edge_mask, bool)
    variables = np.asarray(graph.edge_var)[mask]
    constraints = np.asarray(graph.edge_con)[mask]
    shape = (np.shape(graph.con_mask)[0], np.shape(graph.var_mask)[0])
    # A repeated edge counts twice, as in the segment sums of `policy.released_context`.
    rows = scipy.sparse.csr_matrix(
        (np.ones(variables.shape[0], np.float32), (constraints, variables)), shape=shape)
    columns = rows.T.tocsr()
    edges_of = lambda matrix: np.maximum(np.asarray(matrix.sum(axis=1)).ravel(), 1.0)
    return cls(rows, columns, edges_of(rows).astype(np.float32),
               edges_of(columns).astype(np.float32), np.asarray(graph.var_mask, np.float32))

  def context(self, released: np.ndarray) -> np.ndarray:
    """`policy.released_context` of a neighbourhood ([N] bool), [N, 3] float32."""
    released = np.asarray(released, np.float32) * self.var_mask
    row_share = (self.rows @ released) / self.row_size
    mean = (self.columns @ row_share) / self.degree
    largest = np.zeros_like(mean)
    nonempty = np.diff(self.columns.indptr) > 0
    if nonempty.any():
      largest[nonempty] = np.maximum.reduceat(row_share[self.columns.indices],
                                              self.columns.indptr[:-1][nonempty])
    return np.stack([released, mean, largest], axis=1).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class BranchHead:
  """A trained branch head's two layers as host arrays."""
  embedding_kernel: np.ndarray      # [width, hidden] the first layer's rows for the embedding
  context_kernel: np.ndarray        # [3, hidden] and for the neighbourhood's context
  hidden_bias: np.ndarray           # [hidden]
  out_kernel: np.ndarray            # [hidden, 1]
  out_bias: np.ndarray              # [1]

  @classmethod
  def of(cls, net: policy_lib.TripartiteNet) -> "BranchHead":
    head = net.branch_head
    if len(head.layers) != 2 or head.activation != "relu":
      raise ValueError("the host branch head expects the policy's two-layer ReLU head")
    first, last = head.layers
    kernel = np.asarray(first.kernel.value)
    width = kernel.shape[0] - policy_lib.BRANCH_FEATURES
    return cls(kernel[:width], kernel[width:], np.asarray(first.bias.value),
               np.asarray(last.kernel.value), np.asarray(last.bias.value))

  def prepare(self, embedding: np.ndarray) -> np.ndarray:
    """[N, hidden]: the first layer's pre-activation without the neighbourhood's share."""
    return np.asarray(embedding, np.float32) @ self.embedding_kernel + self.hidden_bias

  def logits(self, prepared: np.ndarray, incidence: Incidence, released: np.ndarray
             ) -> np.ndarray:
    """[N] branch logits of a neighbourhood at the incumbent `prepared` was computed for."""
    hidden = np.maximum(prepared + incidence.context(released) @ self.context_kernel, 0.0)
    return (hidden @ self.out_kernel + self.out_bias)[:, 0]
