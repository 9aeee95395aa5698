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


# Fresh-data runs index a virtual stream this long; past its end the problems repeat. The paper
# preset (2.5M steps x 1024 = 2.56e9 problems) reaches the end after 84% of its steps.
FRESH_STREAM_LENGTH = 2**31 - 1


STATS_MICROBATCH = 128


def fresh_examples(task: tasks.Task, key: jax.Array, example: jax.Array, dtype) -> dict[str, Any]:
  """The raw examples with these indices: example i is drawn from `fold_in(key, i)`, so an index
  names the same problem on every host and after a resume."""
  one = lambda i: jax.tree.map(lambda x: x[0], task.sample(jax.random.fold_in(key, i), 1, dtype))
  return jax.vmap(one)(example)


def stacked(tree: Any, count: int) -> Any:
  return jax.tree.map(lambda x: jnp.broadcast_to(x, (count,) + jnp.shape(x)), tree)


def make_experiment(config: ml_collections.ConfigDict,
                    initial_params: Any = None) -> train_loop.Experiment:
  """`train.num_seeds` replicas of one training run of `config.model` on `config.data.task` with
  `config.optim`, vmapped: replica r is seed r (its own initialisation, statistics batches and,
  with `data.fresh`, its own problems; arms with the same seed share all three).

  The state holds replica-stacked params [R, ...]; `initial_params` (replica-stacked, e.g.
  another run's final parameters) warm-starts every replica, with fresh optimiser and schedule.
  """
  recipe.validate(config.optim)
  size = config.train.microbatch
  config_lib.require(size >= 0 and (size == 0 or config.train.batch_size % size == 0),
                     "train.microbatch",
                     f"{size} does not divide the batch size {config.train.batch_size}")
  num_seeds = config.train.num_seeds
  config_lib.require(num_seeds >= 1, "train.num_seeds", f"must be positive, got {num_seeds}")
  task = make_task(config)
  model = make_model(config, task)
  dtype = dtype_of(config)
  optim = config.optim
  transform = recipe.direction_transform(optim)
  loss_fn = make_loss(model, task)
  cast = lambda batch: jax.tree.map(lambda x: jnp.asarray(x, dtype), dict(batch))
  replicas = jnp.arange(num_seeds)
  # The statistics batches (1024 problems) are accumulated in microbatches: the training
  # microbatch if set, else 128, the size whose activations fit a CPU core's L2 cache (README).
  stats_microbatch = min(optim.stats_batch_size, config.train.microbatch or STATS_MICROBATCH)
  if initial_params is not None:
    leading = {x.shape[0] for x in jax.tree.leaves(initial_params)}
    config_lib.require(leading == {num_seeds}, "train.init_from",
                       f"the source run has {leading} replicas, this one {num_seeds}")

  def init(rng: jax.Array) -> dict[str, Any]:
    if initial_params is None:
      params = jax.vmap(lambda r: model.init(jax.random.fold_in(rng, r)))(replicas)
    else:
      params = jax.tree.map(lambda x: jnp.asarray(x, dtype), initial_params)
    return {"params": params, "opt_state": jax.vmap(transform.init)(params),
            "schedule": stacked(recipe.init_schedule_state(optim, dtype), num_seeds),
            "step": jnp.zeros([], jnp.int32)}

  def replica_batch(batch, replica):
    if not config.data.fresh:
      return cast(batch)
    key = jax.random.fold_in(jax.random.key(config.data.seed), replica)
    return fresh_examples(task, key, batch["example"], dtype)

  def replica_update(params, opt_state, lr, batch):
    loss, grads = microbatch.value_and_grad(loss_fn, config.train.microbatch)(params, batch)
    grad_norm = optax.tree.norm(grads)   # optax.global_norm is deprecated
    skip = recipe.should_skip(grad_norm, optim.clip_norm, optim.skip_norm)
    direction, new_opt_state = transform.update(grads, opt_state, params)
    new_params = recipe.apply_updates(params, direction, lr)
    new_params, new_opt_state = recipe.keep_if(skip, (params, opt_state),
                                               (new_params, new_opt_state))
    return new_params, new_opt_state, loss, grad_norm, skip

  def similarity_of(params, key):
    grad = microbatch.value_and_grad(loss_fn, stats_microbatch)
    grad_of_fresh = lambda k: grad(params, task.sample(k, optim.stats_batch_size, dtype))[1]
    keys = jax.random.split(key, optim.stats_batches)
    return recipe.gradient_similarity(grad_of_fresh, keys).astype(dtype)

  def update(state, batch, rng):
    step = state["step"]
    batches = jax.vmap(lambda r: replica_batch(batch, r))(replicas)
    new_params, opt_state, loss, grad_norm, skip = jax.vmap(replica_update)(
        state["params"], state["opt_state"], state["schedule"]["lr"], batches)
    # The measurement is a cond outside the vmap: inside it, a cond would run on every step.
    keys = jax.vmap(lambda r: jax.random.fold_in(jax.random.fold_in(rng, 1), r))(replicas)
    similarity = jax.lax.cond(recipe.measures_similarity(optim, step),
                              lambda: jax.vmap(similarity_of)(new_params, keys),
                              lambda: state["schedule"]["similarity"])
    schedule = jax.vmap(lambda s, sim: recipe.next_schedule_state(optim, s, step, sim))(
        state["schedule"], similarity)
    new_state = {"params": new_params, "opt_state": opt_state, "schedule": schedule,
                 "step": step + 1}
    metrics = {"loss": jnp.median(loss), "grad_norm": jnp.median(grad_norm),
               "lr": jnp.median(state["schedule"]["lr"]),
               "skipped": jnp.sum(skip.astype(jnp.int32)),
               "grad_similarity_ema": jnp.median(schedule["similarity_ema"])}
    metrics.update({f"loss_seed{r}": loss[r] for r in range(num_seeds)})
    metrics.update({f"lr_seed{r}": state["schedule"]["lr"][r] for r in range(num_seeds)})
    return new_state, metrics

  def evaluate(state, batch):
    errors = jax.vmap(lambda p: loss_fn(p, cast(batch)))(state["params"])
    return {"mse": jnp.median(errors), **{f"mse_seed{r}": errors[r] for r in range(num_seeds)}}

  source_config = builder_config(config, task)
  split = lambda name: least_squares.in_memory_split(source_config, name, config.data.data_dir)

  def train_data(process_index: int, process_count: int):
    if config.data.fresh:
      return pipeline.grain_pipeline(pipeline.IndexSource(FRESH_STREAM_LENGTH),
                                     batch_size=config.train.batch_size, seed=config.seed,
                                     process_index=process_index, process_count=process_count,
                                     shuffle=False)
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
