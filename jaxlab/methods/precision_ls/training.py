"""Model, loss, update and evaluation of one training run, packaged as an `Experiment`."""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from jaxlab.core import config as config_lib
from jaxlab.core import microbatch
from jaxlab.core import train_loop
from jaxlab.data import least_squares
from jaxlab.data import pipeline
from jaxlab.methods.precision_ls import recipe
from jaxlab.methods.precision_ls import tasks
from jaxlab.zoo import functional
from jaxlab.zoo import sequence


def dtype_of(config: ml_collections.ConfigDict):
  return jnp.float64 if config.precision == "float64" else jnp.float32


def make_task(config: ml_collections.ConfigDict) -> tasks.Task:
  data = config.data
  config_lib.require_choice(config, "data.task", tasks.TASKS)
  return tasks.make_task(data.task, d=data.d, n=data.n, length=data.length,
                         width=data.width, k_steps=data.k_steps, step_size=data.step_size)


def make_model(config: ml_collections.ConfigDict, task: tasks.Task) -> functional.Functional:
  m = config.model
  config_lib.require_choice(config, "model.mixer", sequence.MIXERS)
  config_lib.require_choice(config, "model.conv_impl", sequence.CONV_IMPLS)
  config_lib.require(m.width % m.num_heads == 0, "model.num_heads",
                     f"width {m.width} is not divisible by {m.num_heads} heads")
  return functional.Functional(lambda rngs: sequence.Backbone(
      d_in=task.d_in, d_out=task.d_out, width=m.width, depth=m.depth, max_len=task.seq_len,
      mixer=m.mixer, num_heads=m.num_heads, causal=m.causal, use_mlp=m.use_mlp,
      use_layernorm=m.use_layernorm, final_layernorm=m.final_layernorm,
      conv_impl=m.conv_impl, conv_residual=m.conv_residual, mlp_activation=m.mlp_activation,
      init_std=m.init_std, param_dtype=dtype_of(config), rngs=rngs))


def builder_config(config: ml_collections.ConfigDict, task: tasks.Task):
  data = config.data
  if task.source == "problems":
    return least_squares.least_squares_config(
        d=data.d, n=data.n, num_train=data.num_train, num_test=data.num_test,
        condition_number=data.condition_number, seed=data.seed)
  return least_squares.gaussian_sequences_config(
      length=data.length, width=data.width, num_train=data.num_train,
      num_test=data.num_test, seed=data.seed)


def mse(prediction: jax.Array, target: jax.Array) -> jax.Array:
  return jnp.mean(jnp.square(prediction - target))


def make_loss(model: functional.Functional, task: tasks.Task):
  def loss_fn(params: Any, raw_batch: dict[str, jax.Array]) -> jax.Array:
    inputs, targets = task.make(raw_batch)
    outputs = model.apply(params, inputs, last_only=task.last_position_only)
    return mse(task.prediction(outputs), targets)
  return loss_fn


def make_experiment(config: ml_collections.ConfigDict,
                    initial_params: Any = None) -> train_loop.Experiment:
  """One training run of `config.model` on `config.data.task` with `config.optim`.

  `initial_params` warm-starts the model (e.g. from another run's final parameters); the
  optimiser and schedule states start fresh.
  """
  recipe.validate(config.optim)
  size = config.train.microbatch
  config_lib.require(size >= 0 and (size == 0 or config.train.batch_size % size == 0),
                     "train.microbatch",
                     f"{size} does not divide the batch size {config.train.batch_size}")
  task = make_task(config)
  model = make_model(config, task)
  dtype = dtype_of(config)
  optim = config.optim
  transform = recipe.direction_transform(optim)
  loss_fn = make_loss(model, task)
  cast = lambda batch: jax.tree.map(lambda x: jnp.asarray(x, dtype), dict(batch))

  def init(rng: jax.Array) -> dict[str, Any]:
    params = model.init(rng) if initial_params is None else jax.tree.map(
        lambda x: jnp.asarray(x, dtype), initial_params)
    return {"params": params, "opt_state": transform.init(params),
            "schedule": recipe.init_schedule_state(optim, dtype),
            "step": jnp.zeros([], jnp.int32)}

  def update(state, batch, rng):
    params = state["params"]
    loss, grads = microbatch.value_and_grad(loss_fn, config.train.microbatch)(params, cast(batch))
    grad_norm = optax.tree.norm(grads)   # optax.global_norm is deprecated
    skip = recipe.should_skip(grad_norm, optim.skip_norm)
    direction, opt_state = transform.update(grads, state["opt_state"], params)
    new_params = recipe.apply_updates(params, direction, state["schedule"]["lr"])
    new_params, opt_state = recipe.keep_if(skip, (params, state["opt_state"]),
                                           (new_params, opt_state))

    def similarity():
      grad_of_fresh = lambda key: jax.grad(loss_fn)(
          new_params, task.sample(key, config.train.batch_size, dtype))
      keys = jax.random.split(jax.random.fold_in(rng, 1), optim.stats_batches)
      return recipe.gradient_similarity(grad_of_fresh, keys).astype(dtype)

    schedule = recipe.next_schedule_state(optim, state["schedule"], state["step"], similarity)
    new_state = {"params": new_params, "opt_state": opt_state, "schedule": schedule,
                 "step": state["step"] + 1}
    metrics = {"loss": loss, "grad_norm": grad_norm, "lr": state["schedule"]["lr"],
               "skipped": skip.astype(jnp.int32),
               "grad_similarity_ema": schedule["similarity_ema"]}
    return new_state, metrics

  def evaluate(state, batch):
    return {"mse": loss_fn(state["params"], cast(batch))}

  source_config = builder_config(config, task)
  split = lambda name: least_squares.in_memory_split(source_config, name, config.data.data_dir)

  def train_data(process_index: int, process_count: int):
    return pipeline.grain_pipeline(split("train"), batch_size=config.train.batch_size,
                                   seed=config.seed, process_index=process_index,
                                   process_count=process_count)

  def eval_data(process_index: int, process_count: int):
    batches = pipeline.grain_pipeline(split("test"), batch_size=config.eval.batch_size,
                                      seed=0, process_index=process_index,
                                      process_count=process_count, shuffle=False, num_epochs=1)
    for _, batch in zip(range(config.eval.num_batches), batches):
      yield batch

  return train_loop.Experiment(init=init, update=update, train_data=train_data,
                               evaluate=evaluate, eval_data=eval_data)
