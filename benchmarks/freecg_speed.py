"""freecg: one training step per model on Cu38 (batch 4, one replica), the CG product's share of
it, FLOP rate, and the official PyTorch step for reference.

  python benchmarks/freecg_speed.py [--preset quick|paper] [--models freecg,visnet,...]
                                    [--no-append] [--brief]

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* per model, the median seconds of one jitted training step of one replica: energies, forces
  by `jax.grad`, the gradient of the force loss with respect to the parameters (a second-order
  derivative) and the AdamW update, on 4 Cu38 frames of the EMT trajectory;
* FreeCG with e3nn's legacy product (vmapped over groups) in place of the contraction, and the
  CG product's share of a FreeCG step (1 - t(ViSNet) / t(FreeCG): ViSNet is the same network
  without the product);
* XLA's FLOP count of each step and the GFLOP/s next to the jitted matmul peak;
* the official code's time per step, measured here before (torch 2.13, 1 thread: faster than 2;
  Cu38, batch 4): 0.82 s at the quick width (3 layers, C = 64, G = 8), 13.2 s at the paper's
  (9 layers, C = 256, G = 32, 10.1 M parameters). The target is half of each.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 2 timed calls a row.
"""
from __future__ import annotations

import argparse
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import ml_collections  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import CONFIGS, brief_mark, cut, machine, matmul_peak, parse_args, publish, time_call, writes_results, xla_flops  # pylint: disable=g-import-not-at-top
from experiments import freecg as experiment  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.data import md_emt  # pylint: disable=g-import-not-at-top
from jaxlab.methods.freecg import training  # pylint: disable=g-import-not-at-top
from jaxlab.zoo import equivariant  # pylint: disable=g-import-not-at-top

OFFICIAL_SECONDS = {"quick": 0.82, "paper": 13.2}   # torch 2.13 CPU, 1 thread, Cu38, batch 4


def step_seconds(config: ml_collections.ConfigDict, name: str, batch: dict, repeats: int
                 ) -> tuple[float, float, int]:
  """(median seconds, XLA FLOPs, parameters) of one training step of one replica."""
  settings = experiment.train_settings(config, name)
  energies = np.asarray(batch["energy"], np.float64)
  state = training.init_replica(settings, float(energies.mean()), float(energies.std()) or 1.0,
                                jax.random.key_data(jax.random.key(0)))
  step = jax.jit(training.make_train_step(settings))
  index = jnp.asarray(5000)            # past the warm-up: the step as it runs most of the time
  seconds = time_call(lambda s: step(s, batch, index)[1]["train/loss"], state, repeats=repeats)
  flops = xla_flops(lambda s: step(s, batch, index), state)
  return seconds, flops, training.parameter_count(jax.tree.map(lambda a: a[None], state))


def product_seconds(implementation, nodes: int, groups: int, edges: int, repeats: int
                    ) -> tuple[float, float]:
  """(forward, second-order) median seconds of the grouped product alone on [nodes, 8, G E]
  inputs. Second order: the weight gradient of |d(product . r)/d x1|^2, the pattern of a force
  loss (forces are input gradients; training differentiates them by the weights)."""
  keys = jax.random.split(jax.random.key(0), 4)
  weights = jax.random.normal(keys[0], (groups, equivariant.tp_weight_count(edges))) * 0.05
  x1 = jax.random.normal(keys[1], (nodes, 8, groups * edges))
  x2 = jax.random.normal(keys[2], (nodes, 8, groups * edges))
  r = jax.random.normal(keys[3], (nodes, 8, groups * edges))
  product = lambda w, a, b: implementation(w, a, b, groups, edges)  # noqa: E731
  forward = jax.jit(product)

  def force_like_loss(w):
    input_gradient = jax.grad(lambda a: jnp.sum(product(w, a, x2) * r))(x1)
    return jnp.sum(input_gradient ** 2)

  second = jax.jit(jax.grad(force_like_loss))
  return (time_call(forward, weights, x1, x2, repeats=repeats),
          time_call(second, weights, repeats=repeats))


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--preset", default="quick", choices=("quick", "paper"))
  parser.add_argument("--models", default="freecg,freecg_no_shuffle,freecg_dense,visnet,"
                                          "schnet,nequip")
  parser.add_argument("--no-append", action="store_true")
  args = parse_args(parser, preset="smoke")
  host.tune_allocator()
  config = config_lib.load_config(CONFIGS / "freecg.py", args.preset)
  models = [m for m in args.models.split(",") if m]
  repeats = cut(args, 5 if args.preset == "quick" else 3)
  system = "cu13" if args.brief else "cu38"
  frames = md_emt.load_arrays("train", md_emt.md_emt_config(
      system, num_frames=config.data.num_frames, num_train=config.data.num_train,
      num_val=config.data.num_val), config.data.data_dir)
  batch = training.device_arrays({k: v[:config.train.batch_size] for k, v in frames.items()})
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  m = config.model
  official = OFFICIAL_SECONDS.get(args.preset)
  lines = [f"\n## freecg ({args.preset} preset width), {machine()}{brief_mark(args)}\n\n",
           f"One training step of one replica: {system}, batch {config.train.batch_size}, "
           f"{m.layers} layers, C = {m.channels}, G = {m.groups} x E = {m.edges_per_group}, "
           f"{m.num_rbf} RBF, cutoff {m.cutoff} A; energies, forces by jax.grad, the "
           "parameter gradient of the force loss (second order) and AdamW, jitted. Median of "
           f"{repeats} steps after a compiling one. Matmul peak (jitted 2048x2048 jnp.dot): "
           f"{peak:.0f} GFLOP/s float32."
           + (f" Official PyTorch step here (1 thread): {official:.2f} s; target <= "
              f"{official / 2:.2f} s." if official and not args.brief else "") + "\n\n",
           "| model | parameters | s / step | steps / s | vs official FreeCG | GFLOP / step | "
           "GFLOP/s | % of matmul peak |\n|---|---|---|---|---|---|---|---|\n"]
  timings = {}
  rows = [(name, name, config) for name in models]
  if "freecg" in models:
    e3nn_config = config_lib.override(config_lib.load_config(CONFIGS / "freecg.py", args.preset),
                                      {"model.tp_implementation": "e3nn"})
    rows.append(("freecg (e3nn legacy product)", "freecg", e3nn_config))
  for label, name, row_config in rows:
    seconds, flops, params = step_seconds(row_config, name, batch, repeats)
    timings[label] = seconds
    # The official figure is FreeCG's own step: other models are not compared with it.
    ratio = (f"{official / seconds:.1f}x faster" if official and name == "freecg"
             and not args.brief else "-")
    lines.append(f"| {label} | {params:,} | {seconds:.3f} | {1 / seconds:.2f} | {ratio} | "
                 f"{flops / 1e9:.2f} | "
                 f"{flops / seconds / 1e9:.1f} | {100 * flops / seconds / 1e9 / peak:.1f} |\n")
    print(lines[-1], end="", flush=True)
  if "freecg" in timings and "visnet" in timings:
    share = 1.0 - timings["visnet"] / timings["freecg"]
    lines.append(f"\nThe grouped CG product's share of a FreeCG step (1 - t(ViSNet) / "
                 f"t(FreeCG)): {100 * share:.0f}%.\n")
  nodes = 4 * md_emt.NUM_ATOMS["cu38"]
  groups, edges = int(m.groups), int(m.edges_per_group)
  lines.append(f"\nThe grouped product alone, {nodes} nodes (4 x Cu38), G = {groups}, "
               f"E = {edges}, median of {repeats} calls:\n\n"
               "| implementation | forward ms | second-order gradient ms |\n|---|---|---|\n")
  for label, implementation in (("e3nn legacy, vmapped over atoms and groups",
                                 equivariant.grouped_tp_reference),
                                ("contraction (`grouped_tp`)", equivariant.grouped_tp)):
    forward, second = product_seconds(implementation, nodes, groups, edges, repeats)
    lines.append(f"| {label} | {1e3 * forward:.2f} | {1e3 * second:.2f} |\n")
    print(lines[-1], end="", flush=True)
  publish(lines, f"freecg {args.preset}", writes_results(args))


if __name__ == "__main__":
  main()
