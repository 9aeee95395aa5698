"""Fixed train/test samples of one mutual-information task (pairs x, y), as a TFDS builder.

The tasks themselves (distributions, samplers, ground truth) live with the method that benchmarks
them, `jaxlab.methods.flow_mi.tasks`; this layer imports no method. A config therefore carries
the task object (anything with `name`, `dim_x`, `dim_y` and `sample(key, n) -> (x, y)`), and its
name encodes the task's name, the split sizes and the seed, so each combination is cached once:

    from jaxlab.methods.flow_mi import tasks
    arrays = mi_tasks.load_arrays(tasks.get_task("dense-5x5"), 5000, 5000, seed=0)
    x_train, y_train = arrays["train"]

Examples are drawn in float64 and stored exactly (bytes encoding).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Protocol

import jax
import numpy as np
import tensorflow_datasets as tfds

from jaxlab.data import pipeline
from jaxlab.data import sampled

# TFDS's grammar for the config part of "dataset/config:version" (tfds.core.naming): task names
# such as "gaussian-5x5-rho0.95" are valid as they are, so config names keep them verbatim.
_CONFIG_NAME = re.compile(r"^[\w+\-.]+$")


class MITask(Protocol):
  """What the builder needs of a task (`jaxlab.methods.flow_mi.tasks.Task` is one)."""
  name: str
  dim_x: int
  dim_y: int

  def sample(self, key: jax.Array, n: int) -> tuple[jax.Array, jax.Array]: ...


@dataclasses.dataclass
class MITaskConfig(sampled.SampledConfig):
  task: str = ""
  # The task object itself: not part of the name or of equality (the name stands for it).
  task_spec: Any = dataclasses.field(default=None, compare=False, repr=False)


def mi_task_config(*, task: MITask, num_train: int, num_test: int, seed: int = 0
                   ) -> MITaskConfig:
  """A builder config named `<task>_train<n>_test<m>_seed<s>` (so each is cached separately)."""
  if isinstance(task, str):
    raise TypeError(f"pass the task object, e.g. flow_mi.tasks.get_task({task!r}): jaxlab.data "
                    "imports no method, so it cannot look names up")
  name = f"{task.name}_train{num_train}_test{num_test}_seed{seed}"
  if not _CONFIG_NAME.match(name):
    raise ValueError(f"task name {task.name!r} makes the invalid TFDS config name {name!r}; "
                     "use letters, digits and _ + - .")
  return MITaskConfig(name=name, task=task.name, task_spec=task, num_train=num_train,
                      num_test=num_test, seed=seed)


class MITaskSamples(sampled.SampledBuilder):
  """Samples (x [dim_x], y [dim_y], float64) of one mutual-information task."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}

  def features(self):
    task = self.builder_config.task_spec
    return {"x": sampled.float64_tensor((task.dim_x,)),
            "y": sampled.float64_tensor((task.dim_y,))}

  def sample(self, key, count):
    x, y = self.builder_config.task_spec.sample(key, count)
    return {"x": x, "y": y}


def load(builder_config: MITaskConfig, data_dir: str | None = None) -> tfds.core.DatasetBuilder:
  """Builds (once, cached under data_dir) and returns the prepared builder for a config."""
  return pipeline.build(MITaskSamples, builder_config, data_dir)


def load_arrays(task: MITask, num_train: int, num_test: int, seed: int = 0,
                data_dir: str | None = None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  """{"train": (x, y), "test": (x, y)} as float64 numpy arrays [count, dim]."""
  builder = load(mi_task_config(task=task, num_train=num_train, num_test=num_test, seed=seed),
                 data_dir)
  arrays = {}
  for split in ("train", "test"):
    columns = pipeline.data_source(builder, split).columns
    arrays[split] = (columns["x"], columns["y"])
  return arrays
