"""Train-step speed of the jetformer quick configuration, with a profile of one step.

  python benchmarks/jetformer_speed.py [--steps 50] [--no-append] [--brief]

Prints steps/s and achieved GFLOP/s (XLA's cost analysis of the compiled update) of every quick
variant next to this machine's matmul peak, and where one JetFormer step goes (flow forward, decoder
forward, loss + gradient, optimiser), then writes the tables to benchmarks/RESULTS.md in place of
this method's previous ones.

--brief (a GPU smoke check; never writes RESULTS.md): every variant and part as above, on the quick
preset (the smoke preset's smaller model compiles barely faster), timed over 5 steps instead of 50
(`--steps` given explicitly wins) and 3 calls per part instead of 30.
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import all_replica_flops, brief_mark, cut, parse_args, publish, machine, matmul_peak, seconds_per_update, time_call, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.methods.jetformer import reproduction  # pylint: disable=g-import-not-at-top
from jaxlab.methods.jetformer import tokens  # pylint: disable=g-import-not-at-top
from jaxlab.methods.jetformer import training  # pylint: disable=g-import-not-at-top

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "jetformer.py"


def batch_of(config) -> dict[str, jax.Array]:
  arrays = training.train_arrays(config, "train")
  return {k: jnp.asarray(v[:config.train.batch_size]) for k, v in arrays.items()}


def bench_variant(config, steps: int) -> tuple[float, float, float]:
  """(steps/s, GFLOP/s, compile seconds) of the jitted update."""
  experiment = training.make_experiment(config)
  state = jax.jit(experiment.init)(jax.random.key(0))
  batch = batch_of(config)
  update = jax.jit(experiment.update, donate_argnums=0)
  start = time.perf_counter()
  update.lower(state, batch, jax.random.key(1)).compile()
  compile_s = time.perf_counter() - start
  flops = all_replica_flops(experiment.update, state, batch, jax.random.key(1))
  seconds = seconds_per_update(update, state, batch, steps)
  return 1 / seconds, flops / seconds / 1e9, compile_s


def profile(config, repeats: int = 30) -> list[tuple[str, float]]:
  """Milliseconds of the parts of one JetFormer step, each jitted alone."""
  functional = training.make_model(config)
  params = functional.init(jax.random.key(0))
  batch = batch_of(config)
  x = tokens.dequantize(jax.random.key(2), batch["image"], config.data.num_levels)
  patches = tokens.patchify(x, config.model.patch)
  image_first = jnp.zeros(batch["label"].shape, bool)

  def flow(params):
    return functional.module(params).encode(patches)

  def decoder(params, z):
    model = functional.module(params)
    return model.hidden(batch["label"], z[..., :model.ar_dim], image_first)

  def loss(params):
    return training.loss_fn(functional.module(params), batch, jax.random.key(3), config=config,
                            noise_std=jnp.ones([]), train=True)[0]

  optimizer = training.make_optimizer(config)
  opt_state = optimizer.init(params)
  grads = jax.jit(jax.grad(loss))(params)
  z, _ = jax.jit(flow)(params)
  return [
      ("Jet forward (8 couplings)", 1e3 * time_call(jax.jit(flow), params, repeats=repeats)),
      ("decoder forward", 1e3 * time_call(jax.jit(decoder), params, z, repeats=repeats)),
      ("loss forward", 1e3 * time_call(jax.jit(loss), params, repeats=repeats)),
      ("loss + gradient", 1e3 * time_call(jax.jit(jax.grad(loss)), params, repeats=repeats)),
      ("optimiser update", 1e3 * time_call(jax.jit(optimizer.update), grads, opt_state,
                                           params, repeats=repeats)),
  ]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=50)
  parser.add_argument("--no-append", action="store_true")
  args = parse_args(parser, steps=5)
  host.tune_allocator()
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  config = config_lib.load_config(CONFIG, "quick")
  rows = []
  for name in reproduction.selected_variants(config):
    steps_per_s, gflops, compile_s = bench_variant(reproduction.variant_config(config, name),
                                                   args.steps)
    rows.append(f"| {name} | {steps_per_s:.1f} | {compile_s:.1f} | {gflops:.2f} | "
                f"{100 * gflops / peak:.2f}% |\n")
  parts = profile(config, repeats=cut(args, 30, to=3))
  patch = config.model.patch
  text = (f"\n## jetformer quick train step, {machine()}{brief_mark(args)}\n\n"
          f"Batch {config.train.batch_size}, 8x8 digits, {(8 // patch) ** 2} tokens x "
          f"{patch * patch} dims; a step trains every seed of a variant "
          f"({config.train.num_seeds} by default; one after another on one CPU device, "
          "`core.replicas.map_replicas`); GFLOP/s counts every seed's work. "
          "Matmul peak (jitted 2048x2048 jnp.dot): "
          f"{peak:.0f} GFLOP/s float32.\n\n"
          "| variant | steps/s | compile s | GFLOP/s | % of matmul peak |\n|---|---|---|---|---|\n"
          + "".join(rows)
          + "\nWhere one JetFormer step of one seed goes (each part jitted alone):\n\n"
          "| part | ms |\n|---|---|\n" + "".join(f"| {n} | {ms:.1f} |\n" for n, ms in parts))
  publish([text], "jetformer", write=writes_results(args))


if __name__ == "__main__":
  main()
