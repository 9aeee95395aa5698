"""Devices: one `("data",)` mesh, replicated state, batches sharded on their leading axis.

This is the SPMD replacement for pmap: `jax.jit` over arrays with `NamedSharding`s inserts the
gradient all-reduce itself. `jax.shard_map` (with `lax.pmean`/`all_gather`) is for the few places
where per-device semantics matter; `shard_map_over_data` wraps it for the data axis.

Nothing here touches the JAX backend at import time, so `--distributed` can call
`jax.distributed.initialize()` first.
"""
from __future__ import annotations

import math
import os
from typing import Any, Callable

import jax
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib

DATA_AXIS = "data"
_distributed_initialized = False


# CPU processes exchange collectives through gloo (JAX 0.10's CPU client has no other
# cross-process implementation); accelerators use their own and ignore this setting.
CPU_COLLECTIVES = "gloo"


def maybe_init_distributed(enabled: bool | None = None, *, coordinator_address: str | None = None,
                           num_processes: int | None = None, process_id: int | None = None,
                           heartbeat_timeout_seconds: int | None = None) -> bool:
  """Calls `jax.distributed.initialize()` for multi-host runs (TPU pods, Slurm, MPI, or several
  CPU processes on one machine).

  Enabled by `--distributed` or `JAXLAB_DISTRIBUTED=1`. The coordinator address, process count and
  process id are passed on where given; where absent, JAX detects them from the cluster (TPU
  pods, Slurm, Kubernetes). Must run before any other JAX call.
  """
  global _distributed_initialized
  if enabled is None:
    enabled = os.environ.get("JAXLAB_DISTRIBUTED", "0") == "1"
  if enabled and not _distributed_initialized:
    jax.config.update("jax_cpu_collectives_implementation", CPU_COLLECTIVES)
    given = dict(coordinator_address=coordinator_address, num_processes=num_processes,
                 process_id=process_id, heartbeat_timeout_seconds=heartbeat_timeout_seconds)
    jax.distributed.initialize(**{k: v for k, v in given.items() if v is not None})
    _distributed_initialized = True
  return enabled


def make_mesh(mesh_config: ml_collections.ConfigDict | None = None,
              devices: list[jax.Device] | None = None) -> Mesh:
  """A 1-D `("data",)` mesh over `devices` (default: all), with `AxisType.Auto`.

  Auto axes keep the classic propagation: parameters replicated, the batch sharded, and XLA adds
  the reduction of gradients. (`jax.make_mesh` defaults to Explicit axes, under which a plain
  data-parallel gradient raises a ShardingTypeError.)
  """
  devices = list(devices if devices is not None else jax.devices())
  size = len(devices)
  if mesh_config is not None:
    size = config_lib.data_axis_size(
        ml_collections.ConfigDict(dict(mesh=mesh_config)), len(devices))
  return jax.make_mesh((size,), (DATA_AXIS,), axis_types=(AxisType.Auto,),
                       devices=devices[:size])


def batch_mesh(batch_size: int, mesh_config: ml_collections.ConfigDict | None = None,
               devices: list[jax.Device] | None = None) -> Mesh:
  """The data mesh for batches of `batch_size`: the largest number of the (configured) data
  devices that divides it, so that a batch too small for every device is still split, never
  computed whole on each of them (which costs a host of simulated CPU devices that many times the
  arithmetic)."""
  devices = list(devices if devices is not None else jax.devices())
  if batch_size <= 0:
    raise ValueError(f"batch_size must be positive, got {batch_size}")
  size = len(devices)
  if mesh_config is not None:
    size = config_lib.data_axis_size(ml_collections.ConfigDict(dict(mesh=mesh_config)), size)
  return make_mesh(devices=devices[:math.gcd(size, batch_size)])


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def data_sharded(mesh: Mesh) -> NamedSharding:
  """Leading axis split over the data axis, the rest replicated."""
  return NamedSharding(mesh, P(DATA_AXIS))


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Host-local numpy batch -> global arrays sharded over the data axis.

  On one host the local batch is the global batch; on a pod each process passes its own slice
  (what `grain_pipeline` yields for its process index) and the global batch is their union.
  """
  sharding = data_sharded(mesh)
  return jax.tree.map(
      lambda x: jax.make_array_from_process_local_data(sharding, np.asarray(x)), batch)


def put(tree: Any, sharding: NamedSharding) -> Any:
  """`jax.device_put(tree, sharding)` that also works when the sharding spans other processes'
  devices (a pod), where device_put refuses host values and process-local arrays.

  Every process must hold the same global value of each leaf (as with host data every process
  builds the same way, or a seeded initialisation); each keeps the parts its devices own. Leaves
  already global (not fully addressable) are resharded; PRNG key arrays keep their type.
  """
  if jax.process_count() == 1:
    return jax.device_put(tree, sharding)

  def one(leaf):
    if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
      return jax.device_put(leaf, sharding)
    if isinstance(leaf, jax.Array) and jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.wrap_key_data(one(jax.random.key_data(leaf)),
                                      impl=jax.random.key_impl(leaf))
    host = np.asarray(leaf)
    return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])
  return jax.tree.map(one, tree)


def fetch(tree: Any) -> Any:
  """`jax.device_get(tree)` that also works for arrays spanning other processes' devices (a pod):
  those are all-gathered, so every process gets the whole value. A collective on a pod: every
  process must call it, in the same order."""
  if jax.process_count() == 1:
    return jax.device_get(tree)
  from jax.experimental import multihost_utils  # pylint: disable=g-import-not-at-top

  def one(leaf):
    if not isinstance(leaf, jax.Array) or leaf.is_fully_addressable:
      return jax.device_get(leaf)
    if leaf.is_fully_replicated:
      return np.asarray(leaf.addressable_data(0))
    return np.asarray(multihost_utils.process_allgather(leaf, tiled=True))
  return jax.tree.map(one, tree)


def replicate(tree: Any, mesh: Mesh) -> Any:
  """Places a pytree of host values on every device of the mesh."""
  return put(tree, replicated(mesh))


def shard_map_over_data(fn: Callable[..., Any], mesh: Mesh, *, in_specs: Any,
                        out_specs: Any) -> Callable[..., Any]:
  """`jax.shard_map` over the data axis, for code that needs each device's own view."""
  return jax.shard_map(fn, mesh=mesh, in_specs=in_specs, out_specs=out_specs)


def describe_devices() -> str:
  """A short description for results.json, e.g. `cpu x8` or `gpu x1 (NVIDIA H200)`."""
  devices = jax.devices()
  kind = devices[0].device_kind
  text = f"{devices[0].platform} x{len(devices)}"
  text += f" ({os.cpu_count()} cores)" if devices[0].platform == "cpu" else f" ({kind})"
  if jax.process_count() > 1:
    text += f" over {jax.process_count()} processes"
  return text
