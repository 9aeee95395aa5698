"""sr_wdro: seconds per epoch per method, where a training step goes, and the KL weight step
next to the official solver.

  python benchmarks/sr_wdro_speed.py [--preset quick] [--no-append] [--brief]

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* seconds per epoch of the preset's full replica set (every setting, method and seed) in the one
  compiled call the experiment makes, and of each method's seeds alone (the same compiled
  function, fewer replicas), per replica;
* one training step of one replica split into its parts, each jitted alone: the soft-ball attack
  (the preset's steps), the KL worst-case weights (bisection), the update (forward, gradient,
  SGD), with XLA's FLOP count (scans unrolled) and the GFLOP/s next to the matmul peak;
* the weight step beside the official one: cvxpy's exponential-cone program (the official
  `DPPOptimizer`, here solved by Clarabel; the official code asks ECOS or MOSEK) on a batch of
  128, the official batch size, and the bisection on the same batch.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 2 timed calls a row, one
chunk of epochs.
"""
from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, unrolled_flops, writes_results  # pylint: disable=g-import-not-at-top
from experiments import sr_wdro as experiment  # pylint: disable=g-import-not-at-top
from jaxlab.attacks import linf  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.core import replicas  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sr_wdro import data as data_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sr_wdro import training  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sr_wdro import weights as weights_lib  # pylint: disable=g-import-not-at-top

OFFICIAL_BATCH = 128


def chunk_seconds(rows, labels, x_train, eval_x, eval_y, settings, mesh, repeats):
  """Median seconds of one chunk (`eval_every` epochs and the PGD evaluation) for `rows`."""
  inputs = replicas.place(training.replica_inputs([r[1] for r in rows], [r[2] for r in rows],
                                                  labels, settings), mesh)
  steps_per_epoch = x_train.shape[0] // settings.batch_size
  sharding = replicas.replica_sharding(len(rows), mesh)
  chunk = training.chunk_function(settings, steps_per_epoch, sharding)
  init = training.init_function(settings, steps_per_epoch)
  times = []
  for _ in range(repeats + 1):   # the first call compiles
    state = init(inputs.key)
    jax.block_until_ready(state)
    start = time.perf_counter()
    state, metrics = chunk(state, inputs, x_train, eval_x, eval_y, 0, settings.eval_every)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - start)
  times = times[1:]
  return sorted(times)[len(times) // 2]


def main() -> None:
  args, config = preset_command_line("sr_wdro")
  specs, settings_names, settings = experiment.options(config)
  x_train, y_train, x_test, y_test = data_lib.digit_arrays(int(config.data.num_test),
                                                           int(config.data.split_seed))
  eval_x = jnp.asarray(x_test[:int(config.data.num_eval_images)])
  eval_y = jnp.asarray(y_test[:int(config.data.num_eval_images)])
  rows, labels = experiment.replica_table(config, specs, settings_names, y_train)
  mesh = parallel.make_mesh(config.mesh)
  x_train_device = jnp.asarray(x_train)
  repeats = cut(args, 3, to=1)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  steps_per_epoch = x_train.shape[0] // settings.batch_size
  per_chunk = settings.eval_every
  lines = [f"\n## sr_wdro ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"{x_train.shape[0]} training digits, MLP 64-{'-'.join(map(str, settings.hidden))}-10, "
           f"batch {settings.batch_size} ({steps_per_epoch} steps an epoch), soft-ball attack "
           f"{settings.attack_steps} steps; a chunk is {per_chunk} epochs and PGD-"
           f"{settings.eval_steps} on {eval_x.shape[0]} test images. Median of {repeats} chunks "
           f"after a compiling one. Matmul peak (jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s "
           "float32.\n\n",
           "| replicas in the compiled call | replicas | s / epoch (incl. its share of the "
           "evaluation) | s / epoch / replica |\n|---|---|---|---|\n"]
  groups = [("every setting, method and seed (the experiment's call)", list(range(len(rows))))]
  for spec in specs:
    groups.append((f"{spec.name}, noisy seeds only",
                   [i for i, r in enumerate(rows) if r[1].name == spec.name and r[0] == "noisy"]))
  for label, index in groups:
    if not index:
      continue
    seconds = chunk_seconds([rows[i] for i in index], [labels[i] for i in index],
                            x_train_device, eval_x, eval_y, settings, mesh, repeats)
    lines.append(f"| {label} | {len(index)} | {seconds / per_chunk:.3f} | "
                 f"{seconds / per_chunk / len(index):.4f} |\n")
    print(lines[-1], end="", flush=True)

  # One training step of one replica, part by part.
  apply = training.network(settings.hidden).apply
  params = training.network(settings.hidden).init(jax.random.key(0))
  batch = settings.batch_size
  x = jnp.asarray(x_train[:batch])
  y = jnp.asarray(y_train[:batch])
  key = jax.random.key(1)
  epsilon = settings.epsilon
  radius = 0.1

  def attack(params, x, y, key):
    def loss(x_adv):
      return jnp.sum(training.cross_entropy(apply(params, x_adv), y))
    return linf.soft_ball_linf(loss, x, key, epsilon=epsilon,
                               step_size=epsilon * settings.step_fraction,
                               num_steps=settings.attack_steps, lam=0.9,
                               bounds=training.BOUNDS)

  def weights(losses):
    return weights_lib.kl_worst_case_weights(losses, radius,
                                             num_iterations=settings.weight_iterations)

  tx = training.optimizer(settings, steps_per_epoch)
  opt_state = tx.init(params)

  def update(params, opt_state, x_adv, y):
    def objective(params):
      per_example = training.cross_entropy(apply(params, x_adv), y)
      return jnp.sum(weights(per_example) * per_example)
    grads = jax.grad(objective)(params)
    updates, opt_state = tx.update(grads, opt_state, params)
    return jax.tree.map(jnp.add, params, updates), opt_state

  def whole_step(params, opt_state, x, y, key):
    return update(params, opt_state, attack(params, x, y, key), y)

  x_adv = jax.jit(attack)(params, x, y, key)
  losses = training.cross_entropy(apply(params, x_adv), y)
  parts = [(f"soft-ball attack ({settings.attack_steps} steps)", attack, (params, x, y, key)),
           (f"KL weights, bisection ({settings.weight_iterations} iterations)", weights,
            (losses,)),
           ("update: forward, weights, gradient, SGD", update, (params, opt_state, x_adv, y)),
           ("whole training step", whole_step, (params, opt_state, x, y, key))]
  timed = {}
  for label, fn, fn_args in parts:
    timed[label] = (time_call(jax.jit(fn), *fn_args, repeats=cut(args, 50)),
                    unrolled_flops(fn, *fn_args))
  # Alone, a call of microseconds is mostly dispatch: the in-graph cost of the weight step is
  # that of many batches in one vmapped call, divided by their number.
  many = 256
  many_losses = jnp.abs(jax.random.normal(jax.random.key(2), (many, batch))) + losses[None]
  many_seconds = time_call(jax.jit(jax.vmap(weights)), many_losses, repeats=cut(args, 20))
  timed[f"KL weights, in-graph: {many} batches in one vmapped call, per batch"] = (
      many_seconds / many, unrolled_flops(jax.vmap(weights), many_losses) / many)
  step_seconds = timed["whole training step"][0]
  lines.append(f"\nOne training step of one replica (batch {batch}, r = {radius}), each part "
               "jitted alone; FLOPs are XLA's with every scan unrolled:\n\n"
               "| part | ms | % of the step | GFLOP | GFLOP/s | % of peak |\n"
               "|---|---|---|---|---|---|\n")
  for label, (seconds, flops) in timed.items():
    gflops = flops / seconds / 1e9
    lines.append(f"| {label} | {1e3 * seconds:.3f} | {100 * seconds / step_seconds:.1f}% | "
                 f"{flops / 1e9:.4f} | {gflops:.1f} | {100 * gflops / peak:.1f}% |\n")
    print(lines[-1], end="", flush=True)

  # The weight step against the official solver, batch 128.
  rng = np.random.default_rng(0)
  official_losses = rng.gamma(2.0, 0.5, OFFICIAL_BATCH)
  cvxpy_repeats = cut(args, 20)
  weights_lib.cvxpy_reference_weights(official_losses, radius)   # builds the cached program
  start = time.perf_counter()
  for _ in range(cvxpy_repeats):
    reference = weights_lib.cvxpy_reference_weights(official_losses, radius)
  cvxpy_seconds = (time.perf_counter() - start) / cvxpy_repeats
  ours_fn = jax.jit(weights)
  ours_seconds = time_call(ours_fn, jnp.asarray(official_losses, jnp.float32),
                           repeats=cut(args, 200))
  ours = np.asarray(ours_fn(jnp.asarray(official_losses, jnp.float32)), np.float64)
  gap = abs(ours @ official_losses - reference @ official_losses) / (reference @ official_losses)
  lines.append(f"\nThe KL weight step on a batch of {OFFICIAL_BATCH} (gamma-distributed losses, "
               f"r = {radius}); the official code calls cvxpy once a batch:\n\n"
               "| solver | ms / batch | % of our training step | objective vs cvxpy |\n"
               "|---|---|---|---|\n"
               f"| cvxpy + Clarabel, cached parametric program (official formulation) | "
               f"{1e3 * cvxpy_seconds:.2f} | {100 * cvxpy_seconds / step_seconds:.0f}% | - |\n"
               f"| bisection in `lax.fori_loop` (ours, float32) | {1e3 * ours_seconds:.4f} | "
               f"{100 * ours_seconds / step_seconds:.2f}% | {gap:.1e} relative |\n"
               f"| bisection, in-graph ({many} batches of {batch} vmapped, per batch) | "
               f"{1e3 * many_seconds / many:.4f} | {100 * many_seconds / many / step_seconds:.2f}% "
               "| - |\n")
  print(lines[-1], end="", flush=True)
  publish(lines, "sr_wdro", writes_results(args))


if __name__ == "__main__":
  main()
