"""attention_pruning: seconds per method per layer, the GD mask's steps/s and its profile.

  python benchmarks/attention_pruning_speed.py [--preset quick] [--no-append] [--brief]

Setting: the preset's character LM (random weights: speed does not depend on training), its
calibration size (8 windows of 128 characters), every head of one layer at once. Prints, and
writes to benchmarks/RESULTS.md in place of this method's previous table:
* seconds to prune one layer (all heads) per method and setting, compile excluded;
* GD-mask steps per second (one step's loss and gradient for every head at one lam, vmapped:
  the body of the descent's `lax.scan`; the layer's time covers the whole lam grid) with achieved GFLOP/s (XLA's count of that step) next to the
  measured matmul peak;
* the whole sweep's seconds as the quick run logs them (`metrics.seconds` in the results file).
There is no official code, so no reference speed.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 1 timed call.
"""
from __future__ import annotations

import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, writes_results, xla_flops  # pylint: disable=g-import-not-at-top
from experiments import attention_pruning as experiment  # pylint: disable=g-import-not-at-top
from jaxlab.data import python_docs  # pylint: disable=g-import-not-at-top
from jaxlab.methods.attention_pruning import charlm  # pylint: disable=g-import-not-at-top
from jaxlab.methods.attention_pruning import pruning  # pylint: disable=g-import-not-at-top
from jaxlab.methods.attention_pruning import study  # pylint: disable=g-import-not-at-top

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main() -> None:
  args, config = preset_command_line("attention_pruning")
  methods, _, settings, _, gd, sgpt = experiment.options(config)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  corpus = python_docs.char_corpus(config.data.train_fraction)
  model = charlm.make_model(config, corpus.vocab_size)
  params = model.init(jax.random.key(0))
  heads = config.model.num_heads
  windows = python_docs.random_windows(corpus.train, config.data.num_calibration,
                                       config.data.seq_len, seed=0)
  x = charlm.attention_inputs(model, params, windows, corpus.vocab_size)[0]
  w_q, w_k = charlm.attention_kernels(params, 0, heads)
  repeats = cut(args, 3, 1)
  lines = [f"\n## attention_pruning ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"One layer of the char LM: {heads} heads, width {config.model.width}, calibration "
           f"{config.data.num_calibration} x {config.data.seq_len} tokens; GD mask "
           f"{gd.steps} steps for each of {len(gd.lams)} lams (vmapped) + {gd.iterations} power "
           "iterations, then the choice of lam per head; GD steps/s is for one lam. Matmul "
           "peak (jitted "
           f"2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32. No official code, so no "
           "reference speed.\n\n",
           "| what | setting | time | GD steps/s | GFLOP/s | % of peak |\n"
           "|---|---|---|---|---|---|\n"]
  for setting in settings:
    weights = (jnp.asarray(charlm.merged_matrices(w_q, w_k)) if setting == "merged"
               else (jnp.asarray(w_q), jnp.asarray(w_k)))
    for method in methods:
      def prune_layer(method=method, setting=setting):
        pruner = study.LayerPruner(setting, method, gd, sgpt)
        return pruner(("bench",), x, w_q, w_k, 0.5)[0].attn_err
      seconds = time_call(prune_layer, repeats=repeats)
      row = f"| prune one layer: {method} | {setting} | {seconds:.3f} s |"
      if method == "gd_mask":
        step = _gd_step(setting, jnp.asarray(x), weights, gd.causal)
        flops = xla_flops(step, weights)
        step_s = time_call(jax.jit(step), weights, repeats=cut(args, 20, 2))
        gflops = flops / step_s / 1e9
        row += f" {1 / step_s:.0f} | {gflops:.1f} | {100 * gflops / peak:.1f}% |"
      else:
        row += " | | |"
      lines.append(row + "\n")
      print(row, flush=True)
  published = ROOT / "results" / "attention_pruning.json"
  if published.exists() and not args.brief:
    logged = json.loads(published.read_text())["metrics"]["seconds"]
    lines.append("\nThe quick run's sweep (`results/attention_pruning.json`, every layer, "
                 "sparsity and calibration draw, compile included): "
                 + ", ".join(f"{k} {v:.1f} s" for k, v in logged.items()) + ".\n")
  publish(lines, "attention_pruning", writes_results(args))


def _gd_step(setting, x, weights, causal):
  """One GD step's loss and gradient for every head (vmapped), at M = 1: the body the descent's
  `lax.scan` repeats (XLA's cost analysis counts a scan body once, so the step is timed alone)."""
  # pylint: disable=protected-access
  def one_head(weight):
    if setting == "merged":
      fidelity, start = pruning._merged_fidelity(x, weight, causal)
    else:
      fidelity, start = pruning._factors_fidelity(x, weight[0], weight[1], causal)
    return jax.value_and_grad(fidelity)(start)
  return jax.vmap(one_head)


if __name__ == "__main__":
  main()
