"""semantix: seconds per guided step, pairs per second per method, and a guided step's profile.

  python benchmarks/semantix_speed.py [--preset quick] [--no-append] [--brief]

Setting: the preset's prior (loaded from the prior cache, trained there first if absent), its
sampler and a batch of `data.batch_size` pairs. Prints, and writes to benchmarks/RESULTS.md in
place of this method's previous table:
* the two inversions of a batch (context and reference, every visited step);
* per method, a whole batch's sampling from the start step (compile excluded) and pairs/s;
* one guided step (three tapped forward passes, the energy's gradient, the step itself), jitted
  alone, with XLA's FLOP count and GFLOP/s beside the measured matmul peak.
No official figure exists: the paper released no code.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, two methods, 1 timed call.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, writes_results, xla_flops  # pylint: disable=g-import-not-at-top
from experiments import semantix as semantix_experiment  # pylint: disable=g-import-not-at-top
from jaxlab.data import scenes  # pylint: disable=g-import-not-at-top
from jaxlab.diffusion import priors  # pylint: disable=g-import-not-at-top
from jaxlab.methods.semantix import transfer  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("semantix")
  run, methods, spec = semantix_experiment.settings(config)
  prior = priors.load_or_train(spec, config.prior.cache_dir, progress=False)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  batch = config.data.batch_size
  pairs = scenes.semantix_pairs(batch, seed=0, size=config.data.size)
  context, reference = pairs["context"], pairs["reference"]
  key = jax.random.key(0)
  steps, start, stop = transfer.visited_steps(run, spec.num_steps)
  lines = [f"\n## semantix sampling ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"Prior: {spec.size}x{spec.size} eps-UNet, base {dict(spec.architecture)['base_channels']}"
           f" channels, T = {spec.num_steps}; {len(steps)} visited steps, start at step {start} "
           f"(t = {steps[start]}), {start - stop + 1} guided steps; batch {batch} pairs. Matmul "
           f"peak (jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32. No official figure "
           "(no code was released).\n\n",
           "| what | time per batch | pairs/s | GFLOP/s | % of peak |\n|---|---|---|---|---|\n"]

  inverted = transfer.invert(prior, context, reference, key, run)
  seconds = time_call(lambda: transfer.invert(prior, context, reference, key, run),
                      repeats=cut(args, 3, 1))
  lines.append(f"| inversions (context + reference, {len(steps)} steps each) | "
               f"{seconds:.2f} s | {batch / seconds:.1f} | | |\n")
  print(lines[-1], end="", flush=True)
  chosen = methods if not args.brief else methods[:2]
  for method in chosen:
    weights = transfer.method_weights(method, 1.0, 1.0, 1.0, 1.0, 1.0)
    call = lambda: transfer.transfer(prior, context, reference, key, run, method, weights,
                                     inverted=inverted)
    seconds = time_call(call, repeats=cut(args, 2, 1))
    lines.append(f"| {method}: sampling from the start step | {seconds:.2f} s | "
                 f"{batch / seconds:.1f} | | |\n")
    print(lines[-1], end="", flush=True)

  x = inverted.context[start]
  t = jnp.full((batch,), int(steps[start]), jnp.int32)
  wanted = tuple(sorted(set(run.style_taps + run.spatial_taps + (run.sd_tap, run.match_tap))))
  weights = transfer.method_weights("semantix", 1.0, 1.0, 1.0, 1.0, 1.0)

  def guided_step(params, x):
    taps = lambda y, names: prior.apply(params, y, t, taps=names)[1]
    ctx, ref = taps(inverted.context[start], wanted), taps(inverted.reference[start], wanted)
    grad = jax.grad(lambda y: transfer._energy(  # pylint: disable=protected-access
        "semantix", run, weights, taps(y, wanted), ctx, ref))(x)
    return prior.apply(params, x, t) + grad

  flops = xla_flops(guided_step, prior.params, x)
  step = jax.jit(guided_step)
  seconds = time_call(step, prior.params, x, repeats=cut(args, 5, 1))
  lines.append(f"| one guided step (3 tapped forwards, energy gradient, denoiser) | "
               f"{seconds * 1e3:.0f} ms | | {flops / seconds / 1e9:.1f} | "
               f"{100 * flops / seconds / 1e9 / peak:.1f}% |\n")
  print(lines[-1], end="")
  publish(lines, "semantix", writes_results(args))


if __name__ == "__main__":
  main()
