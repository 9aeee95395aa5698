"""Checkpoints: the only module that imports orbax.

A checkpoint at step N holds the state pytree (parameters, optimiser state: pure arrays, never NNX
graph objects or PRNG keys), the data iterator's state (JSON) and a small JSON of metadata. Restores
go through an abstract tree that carries shardings, so arrays land where the mesh wants them.
"""
from __future__ import annotations

import os
import threading
from typing import Any

from absl import logging as absl_logging
from etils import epath
import jax
import orbax.checkpoint as ocp

# orbax splits the save of a replicated array over its replicas, each part a slice that compiles
# its own small program (per shape and replica). For these models' many small arrays that cost
# more than the writes: a 4-step semantix smoke prior (491 arrays, 8 simulated CPU devices) spent
# 12 s of its 45 s in ~220 such compiles. Parts under 1 MiB per replica are saved whole.
_MIN_BYTES_PER_REPLICA_SLICE = 1 << 20


def _register_array_handler() -> None:
  # orbax warns when a handler replaces its default; a run's stderr should not say so each time.
  verbosity = absl_logging.get_verbosity()
  absl_logging.set_verbosity(absl_logging.ERROR)
  try:
    ocp.type_handlers.register_type_handler(
        jax.Array, ocp.type_handlers.ArrayHandler(
            min_slice_bytes_for_replica_parallel=_MIN_BYTES_PER_REPLICA_SLICE), override=True)
  finally:
    absl_logging.set_verbosity(verbosity)


_register_array_handler()

# orbax numbers every save with one process-wide operation id and its background commit waits on
# signals keyed by the current id, so two managers saving at once from different threads mix up
# their ids and one waits for a signal that never comes ("Timeout waiting for key
# 'awaitable_signals_contract_5/...'", seen with flow_mi's `train.parallel_fits = 2`). Saves made
# off the main thread are therefore synchronous and one at a time.
_SAVES_OFF_MAIN_THREAD = threading.Lock()


class Checkpointer:
  """Save / find / restore checkpoints under `directory` (made absolute, as orbax requires)."""

  def __init__(self, directory: str | os.PathLike, max_to_keep: int = 2,
               async_save: bool = True):
    self.directory = epath.Path(os.fspath(directory)).resolve()
    self._off_main_thread = threading.current_thread() is not threading.main_thread()
    self._manager = ocp.CheckpointManager(
        self.directory,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=max_to_keep, create=True,
            enable_async_checkpointing=async_save and not self._off_main_thread),
        item_names=("state", "data", "meta"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return list(self._manager.all_steps())

  def save(self, step: int, state: Any, *, data_state: dict[str, Any] | None = None,
           meta: dict[str, Any] | None = None) -> None:
    """Saves asynchronously (off the main thread: synchronously, one thread at a time); errors
    surface at the next save, `wait` or `close`."""
    if step in self._manager.all_steps():
      return
    if self._off_main_thread:
      with _SAVES_OFF_MAIN_THREAD:
        self._save(step, state, data_state, meta)
    else:
      self._save(step, state, data_state, meta)

  def _save(self, step: int, state: Any, data_state: dict[str, Any] | None,
            meta: dict[str, Any] | None) -> None:
    self._manager.save(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardSave(state),
            data=ocp.args.JsonSave(data_state or {}),
            meta=ocp.args.JsonSave(meta or {})))

  def restore(self, step: int, abstract_state: Any
              ) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """Returns (state, data_state, meta) of `step`.

    `abstract_state` is a pytree of `jax.ShapeDtypeStruct`s with shardings (from
    `abstract_like`); the restored arrays take those shardings.
    """
    restored = self._manager.restore(
        step,
        args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state),
            data=ocp.args.JsonRestore(),
            meta=ocp.args.JsonRestore()))
    return restored["state"], dict(restored["data"] or {}), dict(restored["meta"] or {})

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

  def __enter__(self) -> "Checkpointer":
    return self

  def __exit__(self, *exc) -> None:
    self.close()


def abstract_like(tree: Any, sharding: Any = None) -> Any:
  """ShapeDtypeStructs of `tree`, with `sharding` (or each leaf's own sharding)."""
  def leaf(x):
    return jax.ShapeDtypeStruct(x.shape, x.dtype,
                                sharding=sharding if sharding is not None else x.sharding)
  return jax.tree.map(leaf, tree)


def latest_step(directory: str | os.PathLike) -> int | None:
  """The newest complete checkpoint step under `directory`, or None."""
  path = epath.Path(os.fspath(directory)).resolve()
  if not path.exists():
    return None
  with Checkpointer(path) as checkpointer:
    return checkpointer.latest_step()
