"""Low-rank adapters (LoRA) for the dense and convolution kernels of a parameter pytree.

Works on the pure nested dicts of `functional.Functional` (or any pytree of dicts): every leaf
named `kernel` with at least 2 dimensions gets an adapter. A dense kernel [in, out] and a conv
kernel [..., in, out] (its spatial and input axes flattened into one fan-in axis) are adapted as

    kernel + scale * (A @ B).reshape(kernel.shape),    A [fan_in, rank], B [rank, out],

with A ~ N(0, 1 / fan_in) and B = 0, so the adapted parameters equal the pretrained ones at
initialisation and only A and B are trained. `scale` is alpha / rank (LoRA's convention, so
changing the rank does not change the update's size at a given learning rate).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

PyTree = Any
# (path, kernel) -> whether this kernel gets an adapter.
KernelFilter = Callable[[tuple[str, ...], jax.Array], bool]


def _path_names(path) -> tuple[str, ...]:
  return tuple(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def kernel_name(path: tuple[str, ...]) -> str:
  """An adapter's key: the kernel's path joined by "/" (string keys, as orbax needs)."""
  return "/".join(path)


def is_adaptable(path: tuple[str, ...], leaf: Any) -> bool:
  """The default filter: a leaf named `kernel` of a dense (2-D) or conv (>= 3-D) layer."""
  return bool(path) and path[-1] == "kernel" and getattr(leaf, "ndim", 0) >= 2


def init(params: PyTree, rank: int, key: jax.Array, *, where: KernelFilter = is_adaptable,
         cap_rank: bool = False) -> dict[str, dict[str, jax.Array]]:
  """Adapters {kernel path "a/b/kernel": {"a": [fan_in, rank], "b": [rank, out]}} with b = 0.

  A flat dict of string keys is itself a pytree, so optax, jax.grad and orbax take it as it is.
  A kernel thinner than `rank` (min(fan_in, out) < rank, e.g. the input layer of a 2-D model) is
  an error, or with `cap_rank` gets an adapter of rank min(fan_in, out): a full-rank update.
  """
  if rank < 1:
    raise ValueError(f"LoRA rank must be at least 1, got {rank}")
  leaves = [(_path_names(path), leaf)
            for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]
  chosen = [(path, leaf) for path, leaf in leaves if where(path, leaf)]
  if not chosen:
    raise ValueError("no kernel in these parameters matches the LoRA filter")
  adapters = {}
  for (path, kernel), subkey in zip(chosen, jax.random.split(key, len(chosen))):
    fan_in, out = int(kernel.size // kernel.shape[-1]), kernel.shape[-1]
    if rank > min(fan_in, out) and not cap_rank:
      raise ValueError(f"LoRA rank {rank} exceeds min(fan_in, out) = {min(fan_in, out)} of "
                       f"kernel {'/'.join(path)} {tuple(kernel.shape)}")
    kernel_rank = min(rank, fan_in, out)
    adapters[kernel_name(path)] = {
        "a": jax.random.normal(subkey, (fan_in, kernel_rank), kernel.dtype) / jnp.sqrt(fan_in),
        "b": jnp.zeros((kernel_rank, out), kernel.dtype)}
  return adapters


def merge(params: PyTree, adapters: dict[str, dict[str, jax.Array]], scale: float) -> PyTree:
  """`params` with every adapted kernel replaced by kernel + scale * A @ B (reshaped)."""
  def adapt(path, leaf):
    name = kernel_name(_path_names(path))
    if name not in adapters:
      return leaf
    low_rank = adapters[name]["a"] @ adapters[name]["b"]
    return leaf + scale * low_rank.reshape(leaf.shape).astype(leaf.dtype)
  missing = set(adapters) - {kernel_name(_path_names(path)) for path, _ in
                             jax.tree_util.tree_flatten_with_path(params)[0]}
  if missing:
    raise ValueError(f"adapters for kernels these parameters do not have: {sorted(missing)}")
  return jax.tree_util.tree_map_with_path(adapt, params)


def count(adapters: dict[str, dict[str, jax.Array]]) -> int:
  """Trainable numbers in the adapters."""
  return sum(x.size for x in jax.tree.leaves(adapters))
