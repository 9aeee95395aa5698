"""The tripartite attention GNN (reconstructed; unverified against the paper) and its two heads.

Rounds of GAT-style edge attention (`zoo.graph.EdgeAttention`) on the padded `features.Graph`:
variables -> constraints, constraints -> variables, {variables, constraints} -> objective, then
objective -> {variables, constraints}; every update is residual and layer-normed. Heads:

* destroy: a logit per virtual variable (bit) from the variable's embedding and the bit's
  features; binarized tightening releases a variable from its chosen bit on, and the ablation
  without it reads only bit 0 (the whole variable);
* branch: a logit per variable, "should this fixed variable have been released?", from the
  variable's embedding and the destroy step's neighbourhood: whether the variable is released,
  and the mean and largest share of released variables among the constraints it appears in.

The trunk (embeddings and rounds) reads the incumbent's graph only. The neighbourhood enters at
the branch head alone, so the LNS loop runs the trunk once per incumbent and the branch head,
a small MLP after one scalar message pass, every step. Branching parameters are a destroy
network's with a trained branch head (`same_trunk` checks the pairing).

`Policy` holds the network's graph definition; `logits(policy, params, graph, released)` is the
pure function of (parameters, padded graph, neighbourhood) that training differentiates, and
`bind(policy, params)` the jitted `graph -> (embedding, destroy scores)` the LNS loop calls once
per incumbent; it compiles once per size bucket (`chex.assert_max_traces` guards this in the
tests). The loop evaluates the branch head on the host from those embeddings (`host_branch`).
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import chex
from flax import nnx
import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.methods.btbs_lns import features
from jaxlab.zoo import graph as graph_zoo
from jaxlab.zoo import mlp


@dataclasses.dataclass(frozen=True)
class PolicySpec:
  width: int = 32
  num_heads: int = 4
  rounds: int = 1
  max_bits: int = 8

  def __post_init__(self):
    if self.width < 1 or self.width % self.num_heads:
      raise ValueError(f"policy.width {self.width} must be a positive multiple of "
                       f"policy.num_heads {self.num_heads}")
    if self.rounds < 1:
      raise ValueError(f"policy.rounds must be >= 1, got {self.rounds}")
    if not 1 <= self.max_bits <= 30:
      raise ValueError(f"policy.max_bits must be in 1..30, got {self.max_bits}")


class _Round(nnx.Module):
  """One var -> con -> var -> obj -> {var, con} pass."""

  def __init__(self, width: int, num_heads: int, rngs: nnx.Rngs):
    attention = functools.partial(graph_zoo.EdgeAttention, width, width, 1, width,
                                  num_heads=num_heads, rngs=rngs)
    self.var_to_con, self.con_to_var = attention(), attention()
    self.var_to_obj, self.con_to_obj = attention(), attention()
    self.obj_to_var, self.obj_to_con = attention(), attention()
    self.norms = nnx.List([nnx.LayerNorm(width, rngs=rngs) for _ in range(5)])

  def __call__(self, v, c, o, g: features.Graph):
    n, m = v.shape[0], c.shape[0]
    zeros_n, zeros_m = jnp.zeros(n, jnp.int32), jnp.zeros(m, jnp.int32)
    c = self.norms[0](c + self.var_to_con(v, c, g.edge_coef, g.edge_var, g.edge_con,
                                          g.edge_mask))
    v = self.norms[1](v + self.con_to_var(c, v, g.edge_coef, g.edge_con, g.edge_var,
                                          g.edge_mask))
    # One objective node: every variable and constraint sends to node 0.
    from_vars = self.var_to_obj(v, o, g.var_obj, jnp.arange(n), zeros_n, g.var_mask)
    from_cons = self.con_to_obj(c, o, g.con_obj, jnp.arange(m), zeros_m, g.con_mask)
    o = self.norms[2](o + from_vars + from_cons)
    v = self.norms[3](v + self.obj_to_var(o, v, g.var_obj, zeros_n, jnp.arange(n), g.var_mask))
    c = self.norms[4](c + self.obj_to_con(o, c, g.con_obj, zeros_m, jnp.arange(m), g.con_mask))
    return v, c, o


BRANCH_FEATURES = 3     # released, mean and largest released share of the variable's rows


def released_context(g: features.Graph, released: jax.Array) -> jax.Array:
  """[N, BRANCH_FEATURES]: whether each variable is released, and the mean and the largest share
  of released variables over the constraints it appears in (0 without constraints)."""
  num_vars, num_cons = g.var_mask.shape[0], g.con_mask.shape[0]
  edge = g.edge_mask.astype(jnp.float32)
  released = released.astype(jnp.float32) * g.var_mask
  row_size = jax.ops.segment_sum(edge, g.edge_con, num_cons)
  row_share = jax.ops.segment_sum(released[g.edge_var] * edge, g.edge_con, num_cons) \
      / jnp.maximum(row_size, 1.0)
  per_edge = row_share[g.edge_con] * edge
  degree = jax.ops.segment_sum(edge, g.edge_var, num_vars)
  mean = jax.ops.segment_sum(per_edge, g.edge_var, num_vars) / jnp.maximum(degree, 1.0)
  largest = jnp.maximum(jax.ops.segment_max(per_edge, g.edge_var, num_vars), 0.0)
  return jnp.stack([released, mean, largest], axis=1)


class TripartiteNet(nnx.Module):
  """Padded graph (and a neighbourhood) -> (destroy logits [N, D], branch logits [N])."""

  def __init__(self, spec: PolicySpec, *, rngs: nnx.Rngs):
    width = spec.width
    self.spec = spec
    self.embed_var = mlp.MLP([features.VAR_FEATURES, width, width], activation="relu",
                             rngs=rngs)
    self.embed_con = mlp.MLP([features.CON_FEATURES, width, width], activation="relu",
                             rngs=rngs)
    self.embed_obj = mlp.MLP([features.OBJ_FEATURES, width, width], activation="relu",
                             rngs=rngs)
    self.rounds = nnx.List([_Round(width, spec.num_heads, rngs) for _ in range(spec.rounds)])
    self.destroy_head = mlp.MLP([width + features.BIT_FEATURES, width, 1], activation="relu",
                                rngs=rngs)
    self.branch_head = mlp.MLP([width + BRANCH_FEATURES, width, 1], activation="relu",
                               rngs=rngs)

  def trunk(self, g: features.Graph) -> jax.Array:
    """[N, width] variable embeddings at the graph's incumbent."""
    chex.assert_rank(g.variables, 2)
    v, c, o = self.embed_var(g.variables), self.embed_con(g.constraints), \
        self.embed_obj(g.objective)
    for block in self.rounds:
      v, c, o = block(v, c, o, g)
    return v

  def destroy(self, v: jax.Array, g: features.Graph) -> jax.Array:
    depth = g.bits.shape[1]
    per_bit = jnp.concatenate([jnp.broadcast_to(v[:, None], (v.shape[0], depth, v.shape[1])),
                               g.bits], axis=-1)
    return self.destroy_head(per_bit)[..., 0]

  def branch(self, v: jax.Array, g: features.Graph, released: jax.Array) -> jax.Array:
    return self.branch_head(jnp.concatenate([v, released_context(g, released)], axis=1))[:, 0]

  def __call__(self, g: features.Graph, released: jax.Array, *, frozen_trunk: bool = False
               ) -> tuple[jax.Array, jax.Array]:
    v = self.trunk(g)
    branch_input = jax.lax.stop_gradient(v) if frozen_trunk else v
    return self.destroy(v, g), self.branch(branch_input, g, released)


@dataclasses.dataclass(frozen=True)
class Policy:
  """The network's static structure; parameters travel separately as a pytree."""
  spec: PolicySpec
  graphdef: nnx.GraphDef

  @classmethod
  def create(cls, spec: PolicySpec, seed: int = 0) -> tuple["Policy", nnx.State]:
    net = TripartiteNet(spec, rngs=nnx.Rngs(seed))
    graphdef, params = nnx.split(net)
    return cls(spec, graphdef), params

  def init(self, seed: int) -> nnx.State:
    return nnx.split(TripartiteNet(self.spec, rngs=nnx.Rngs(seed)))[1]


def logits(policy: Policy, params: nnx.State, graph: features.Graph, released: jax.Array, *,
           frozen_trunk: bool = False) -> tuple[jax.Array, jax.Array]:
  """(destroy [N, D], branch [N]) of a padded graph and neighbourhood (`released` [N]: the
  variables the destroy step released); padding entries arbitrary. `frozen_trunk`: the branch
  head's gradient stops at the embeddings (training a branch head on a destroy network)."""
  return nnx.merge(policy.graphdef, params)(graph, released, frozen_trunk=frozen_trunk)


def network(policy: Policy, params: nnx.State) -> TripartiteNet:
  return nnx.merge(policy.graphdef, params)


def _destroy_pass(policy, params, graph):
  net = network(policy, params)
  v = net.trunk(graph)
  return v, net.destroy(v, graph)


def destroy_logits(policy: Policy, params: nnx.State, graph: features.Graph) -> jax.Array:
  """The destroy head's [N, D] logits alone (the branch head not run)."""
  return _destroy_pass(policy, params, graph)[1]


# `graph -> (embedding [N, width], destroy logits [N, D])`: the trunk and destroy head at an
# incumbent, with fixed parameters.
Network = Callable[[features.Graph], tuple[jax.Array, jax.Array]]


@functools.lru_cache(maxsize=16)
def _compiled(policy: Policy, treedef) -> Callable:
  return jax.jit(lambda leaves, graph: _destroy_pass(
      policy, jax.tree_util.tree_unflatten(treedef, leaves), graph))


def bind(policy: Policy, params: nnx.State) -> Network:
  """The jitted trunk and destroy head for the LNS loop's calls (the embeddings stay on the
  device). The parameters are flattened and placed once: passing `policy` and the `nnx.State`
  to a jitted function on every call would hash the graph definition (0.6 ms) and flatten the
  state (0.1 ms) each time, a third of a quick-size forward pass. The loop runs the branch head
  on the host (`host_branch`)."""
  leaves, treedef = jax.tree_util.tree_flatten(params)
  return functools.partial(_compiled(policy, treedef), jax.device_put(leaves))


_jitted = jax.jit(logits, static_argnums=0)


def jitted_logits(policy: Policy, params: nnx.State, graph: features.Graph,
                  released: np.ndarray | None = None) -> tuple[jax.Array, jax.Array]:
  """`logits`, jitted (one-off calls and tests); `released` defaults to an empty
  neighbourhood."""
  if released is None:
    released = np.zeros(graph.variables.shape[0], bool)
  return _jitted(policy, params, graph, released)


def _is_trunk(path) -> bool:
  return "branch_head" not in jax.tree_util.keystr(path)


def same_trunk(params: nnx.State, other: nnx.State) -> bool:
  """Whether two parameter sets differ at most in the branch head (a destroy network and the
  branching parameters trained on it)."""
  leaves = jax.tree_util.tree_flatten_with_path(params)[0]
  others = jax.tree_util.tree_flatten_with_path(other)[0]
  if [jax.tree_util.keystr(p) for p, _ in leaves] != [jax.tree_util.keystr(p) for p, _ in others]:
    return False
  return all(np.array_equal(np.asarray(a), np.asarray(b))
             for (path, a), (_, b) in zip(leaves, others) if _is_trunk(path))
