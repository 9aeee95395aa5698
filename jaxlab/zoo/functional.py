"""NNX module -> pure `apply(params, ...)` over a plain parameter pytree.

Training code never calls `nnx.jit`/`nnx.grad`/`nnx.Optimizer`. A module factory is split once into
its graph definition, its parameters (a nested dict of arrays: what optax, `jax.grad` and orbax
see) and the rest (non-trainable variables such as fixed permutations, kept out of the optimiser).
`apply` merges them inside whatever transformation calls it, so it is a pure function of `params`;
`init(rng)` builds fresh parameters and can itself be jitted or `jax.eval_shape`d.
"""
from __future__ import annotations

from typing import Any, Callable

from flax import nnx
import jax

PyTree = Any
ModuleFactory = Callable[[nnx.Rngs], nnx.Module]


class Functional:
  """A module seen as `init(rng) -> params` and `apply(params, *args, method=...)`.

  Non-trainable variables are built once, concretely, from `Rngs(0)`; they must not depend on the
  init key (derive them from a config seed instead).
  """

  def __init__(self, factory: ModuleFactory):
    self.factory = factory
    abstract = nnx.eval_shape(lambda: factory(nnx.Rngs(0)))
    self.graphdef, _, rest = nnx.split(abstract, nnx.Param, ...)
    if jax.tree.leaves(rest):
      _, _, rest = nnx.split(factory(nnx.Rngs(0)), nnx.Param, ...)
    self.rest = rest

  def init(self, rng: jax.Array) -> PyTree:
    """Fresh parameters as a pure nested dict."""
    return nnx.to_pure_dict(nnx.state(self.factory(nnx.Rngs(rng)), nnx.Param))

  def module(self, params: PyTree) -> nnx.Module:
    """The module with `params` merged in (inside a traced function, or for inspection)."""
    return nnx.merge(self.graphdef, params, self.rest)

  def apply(self, params: PyTree, *args: Any, method: str = "__call__", **kwargs: Any) -> Any:
    return getattr(self.module(params), method)(*args, **kwargs)

  __call__ = apply


def count_params(params: PyTree) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
