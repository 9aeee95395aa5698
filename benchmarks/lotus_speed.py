"""Lotus UNet: training steps per second and inference images per second per variant.

  python benchmarks/lotus_speed.py [--preset quick] [--no-append] [--brief]

--brief (a GPU smoke check; never writes RESULTS.md): the smoke preset unless --preset is given (a
2-level, 8-channel UNet on 16x16 images, batch 8: the smallest sizes, and a somewhat shorter compile
than quick's), every step, variant and part as below, each timed over 2 calls instead of 3 to 5.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* train steps/s of the prior and of each variant's fine-tuning step (batch of the preset), with
  XLA's FLOP count and the achieved GFLOP/s next to the machine's matmul peak;
* inference images/s of each variant (multi-step: DDIM with the preset's steps; single-step: one
  network call);
* where one fine-tuning step goes (each part jitted alone): UNet forward, loss + gradient, AdamW.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, publish, machine, matmul_peak, preset_command_line, time_call, train_step_row, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.methods.lotus import training  # pylint: disable=g-import-not-at-top
from jaxlab.methods.lotus import variants  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("lotus")
  size, batch = config.data.size, config.train.batch_size
  rng = jax.random.key(0)
  data = {"image": jax.random.uniform(rng, (batch, size, size, 3)) * 2 - 1,
          "target": jax.random.uniform(rng, (batch, size, size, 3)) * 2 - 1}
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  lines = [f"\n## lotus UNet ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"UNet base {config.model.base_channels} channels, multipliers "
           f"{tuple(config.model.channel_multipliers)}, {size}x{size}, batch {batch}. Matmul "
           f"peak (jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32.\n\n",
           "| step | steps/s | GFLOP/step | GFLOP/s | % of peak |\n|---|---|---|---|---|\n"]
  for name in [None, *variants.VARIANTS]:
    experiment = training.make_experiment(config, variant=name, task="depth")
    lines.append(train_step_row(name or "prior", experiment, data, rng, peak=peak,
                                repeats=cut(args, 5)))
    print(lines[-1], end="", flush=True)

  lines.append("\n| variant | inference images/s | network calls per image |\n|---|---|---|\n")
  params = training.make_model(config).init(rng)
  images = jnp.tile(data["image"], (max(1, config.eval.batch_size // batch), 1, 1, 1))
  for name, variant in variants.VARIANTS.items():
    predict = training.predictor(config, name)
    seconds = time_call(predict, params, images, rng, repeats=cut(args, 3))
    calls = 1 if variant.single_step else config.diffusion.sample_steps
    lines.append(f"| {name} | {images.shape[0] / seconds:.0f} | {calls} |\n")
    print(lines[-1], end="", flush=True)

  model = training.make_model(config)
  schedule = training.make_schedule(config)
  optimizer = training.make_optimizer(config.optim.lr, config.train.steps)
  opt_state = optimizer.init(params)
  x = jnp.concatenate([data["image"], data["target"]], -1)
  t = jnp.full((batch,), schedule.num_steps - 1)
  labels = jnp.zeros((batch,), jnp.int32)

  def loss(p):
    return training.finetune_loss(model.module(p), schedule, variants.VARIANTS["lotus_g"], data,
                                  rng)[0]
  grads = jax.grad(loss)(params)
  parts = [("UNet forward", jax.jit(lambda p: model.apply(p, x, t, labels)), (params,)),
           ("loss + gradient", jax.jit(jax.grad(loss)), (params,)),
           ("AdamW update", jax.jit(lambda g, s, p: optimizer.update(g, s, p)),
            (grads, opt_state, params))]
  lines.append("\nWhere one Lotus-G fine-tuning step goes (each part jitted alone):\n\n"
               "| part | ms |\n|---|---|\n")
  for name, fn, fn_args in parts:
    lines.append(f"| {name} | {1e3 * time_call(fn, *fn_args, repeats=cut(args, 5)):.1f} |\n")
  publish(lines, "lotus", write=writes_results(args))


if __name__ == "__main__":
  main()
