"""Speed of one SG unlearning epoch: the retain (FT) pass and the auditor + implicit step.

  python benchmarks/sg_unlearn_speed.py [--no-append] [--brief]

Setting: the quick preset (noisy digits, 500 training images, MLP 64-256-256-10, batch 128, the
auditor's 10 classes x 3 folds of logistic attackers, 12 Newton steps), every seed and alpha of
the quick sweep as replicas of one vmapped call (5 seeds x 8 alphas = 40), and one replica alone.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* seconds per unlearning epoch (steady state, compile excluded) of the whole SG epoch, of its
  retain pass alone and of its adversarial step alone (auditor fit + implicit gradient + update);
* where the adversarial step's time goes (each part jitted alone): the scores' forward, the
  attackers' Newton solves, the utility with its implicit gradient;
* achieved GFLOP/s (XLA's cost analysis) next to the machine's measured matmul peak.

--brief (a GPU smoke check; never writes RESULTS.md): every row as above, each 5-epoch call timed
once after its warm-up instead of 3 times, each profiled part over 3 calls instead of 20.
"""
from __future__ import annotations

import argparse
import dataclasses
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, parse_args, publish, machine, matmul_peak, time_call, xla_flops, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sg_unlearn import auditor  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sg_unlearn import data as data_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sg_unlearn import reproduction  # pylint: disable=g-import-not-at-top
from jaxlab.methods.sg_unlearn import unlearning  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHUNK = 5


def replicas(config, splits, num_seeds: int, alphas: list[float]):
  seeds = list(range(num_seeds))
  forget = [data_lib.forget_mask(splits.y_train, "random", s) for s in seeds]
  size = int(max(f.sum() for f in forget))
  samples = [reproduction.auditor_samples(splits, f, size, config, s)
             for f, s in zip(forget, seeds)]
  keys = [jax.random.key(s) for s in seeds]
  return reproduction.replica_inputs(
      keys * len(alphas), [(~f).astype(np.float32) for f in forget] * len(alphas),
      [splits.y_train] * num_seeds * len(alphas), [a for a in alphas for _ in seeds],
      samples * len(alphas))


def seconds_per_epoch(model, recipe, inputs, x_train, repeats: int = 3) -> float:
  chunk = unlearning.vectorize(unlearning.replica_chunk(model, recipe))
  params = jax.vmap(model.init)(inputs.key)
  holder = {"state": jax.vmap(lambda p: unlearning.init_state(p, recipe))(params)}
  args = (inputs, x_train, jnp.asarray(0), jnp.asarray(CHUNK))

  def run():
    holder["state"], metrics = chunk(holder["state"], *args)
    return metrics
  return time_call(run, repeats=repeats) / CHUNK


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--no-append", action="store_true")
  args = parse_args(parser)
  host.tune_allocator()
  config = config_lib.load_config(ROOT / "configs" / "sg_unlearn.py", "quick")
  splits = data_lib.load_splits(config.data.num_train, seed=config.data.split_seed,
                                pixel_noise=config.data.pixel_noise)
  model = unlearning.classifier(tuple(config.model.hidden))
  x_train = jnp.asarray(splits.x_train)
  sg = dataclasses.replace(reproduction.recipe(config, "sg", len(splits.y_train)),
                           chunk_epochs=CHUNK)
  ft = dataclasses.replace(sg, adversarial=False)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  alphas = [0.0, *config.auditor.alphas]

  lines = [f"\n## sg_unlearn unlearning epoch, {machine()}{brief_mark(args)}\n\n",
           f"Quick preset: {len(splits.y_train)} noisy digits, MLP 64-{'-'.join(map(str, config.model.hidden))}-10, "
           f"batch {config.train.batch_size}, auditor 10 classes x {config.auditor.folds} folds, "
           f"{config.auditor.newton_steps} Newton steps. Matmul peak (jitted 2048x2048 jnp.dot): "
           f"{peak:.0f} GFLOP/s float32.\n\n",
           "| replicas | SG epoch s | retain pass s | adversarial step s | GFLOP/s | % of peak |\n"
           "|---|---|---|---|---|---|\n"]
  for num_seeds, alpha_list in ((1, [1.0]), (config.data.num_seeds, alphas)):
    inputs = replicas(config, splits, num_seeds, alpha_list)
    count = inputs.alpha.shape[0]
    epoch_s = seconds_per_epoch(model, sg, inputs, x_train, repeats=cut(args, 3, to=1))
    retain_s = seconds_per_epoch(model, ft, inputs, x_train, repeats=cut(args, 3, to=1))
    adversarial_s = epoch_s - retain_s
    flops = count * epoch_flops(model, sg, inputs, x_train)
    lines.append(f"| {count} | {epoch_s:.4f} | {retain_s:.4f} | {adversarial_s:.4f} | "
                 f"{flops / epoch_s / 1e9:.2f} | {100 * flops / epoch_s / 1e9 / peak:.2f}% |\n")
    print(lines[-1], end="", flush=True)

  lines.append("\nWhere one adversarial step goes (one replica, each part jitted alone):\n\n"
               "| part | ms |\n|---|---|\n")
  for name, ms in profile(model, sg, replicas(config, splits, 1, [1.0]),
                          repeats=cut(args, 20, to=3)):
    lines.append(f"| {name} | {ms:.2f} |\n")
  publish(lines, "sg_unlearn", write=writes_results(args))


def one_replica(tree):
  return jax.tree.map(lambda a: a[0], tree)


def epoch_flops(model, recipe, inputs, x_train) -> float:
  """One replica's epoch: `batches_per_epoch` retain steps and one adversarial step."""
  inputs1 = one_replica(inputs)
  params = model.init(inputs1.key)
  rows = jnp.arange(recipe.batch_size)

  def retain_step(params):
    return jax.grad(lambda p: jnp.mean(unlearning.per_example_ce(
        model.apply(p, x_train[rows]), inputs1.base_labels[rows])))(params)

  def adversarial_step(params):
    return jax.grad(lambda p: unlearning.auditor_utility(model, recipe, p, inputs1.auditor))(
        params)
  return (recipe.batches_per_epoch * xla_flops(retain_step, params)
          + xla_flops(adversarial_step, params))


def profile(model, recipe, inputs, repeats: int = 20):
  inputs1 = one_replica(inputs)
  params = model.init(inputs1.key)
  samples = inputs1.auditor

  def scores(p):
    return unlearning.auditor_scores(model.apply(p, samples.x), samples.y, recipe.score)

  def solves(s):
    return auditor.fit_attackers(s, samples.member_sign, samples.train_weights,
                                 l2=recipe.auditor_l2, newton_steps=recipe.newton_steps)

  def utility_and_grad(p):
    return jax.value_and_grad(lambda q: unlearning.auditor_utility(model, recipe, q, samples))(p)

  s = jax.jit(scores)(params)
  parts = [("scores forward (MLP on forget + validation samples)", jax.jit(scores), params),
           ("attackers' Newton solves (10 classes x 3 folds)", jax.jit(solves), s),
           ("utility + implicit gradient w.r.t. the network", jax.jit(utility_and_grad), params)]
  return [(name, 1e3 * time_call(fn, arg, repeats=repeats)) for name, fn, arg in parts]


if __name__ == "__main__":
  main()
