"""diffusion_purification: PGD attack steps through the purifier, where an EOT step goes, and
training steps per second.

  python benchmarks/diffusion_purification_speed.py [--preset quick] [--no-append] [--brief]

--brief (a GPU smoke check; never writes RESULTS.md): the smoke preset unless --preset is given (the
FLOP counts compile the purifier with its scans unrolled, 41 reverse steps in the quick preset, 3 in
smoke, on 8x8 images with EOT 2), every row as below, each timed over 2 calls instead of 10 to 30.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous tables
(random-initialised networks, every parameter moved by 0.01 N(0, 1) so the zero-initialised
output layer does not make the purifier the identity; a batch of `eval.batch_size` random images
in [-1, 1]):
* seconds per PGD step through the purifier and classifier, with the stochastic white-box keys
  (EOT draws of the preset) and with the DW-box keys (EOT 1), images x EOT draws per second, the
  FLOPs of one step and the achieved GFLOP/s next to the machine's matmul peak;
* where one EOT attack step goes (each part jitted alone): a denoiser forward, the purifier
  forward (t* + 1 reverse steps), the purifier forward + gradient w.r.t. x of one EOT draw with
  and without rematerialisation, the classifier forward + gradient;
* train steps/s of DDPM pretraining and of the plain, ADDT-without-RBGM and ADDT fine-tuning
  steps, and the time of one RBGM call.

FLOP counts: XLA's cost analysis counts a `lax.scan` body once, whatever its length, which would
count one of the purifier's t* + 1 reverse steps (and one CGPO iteration of ADDT). The counts
below come from XLA on the same functions traced with every scan unrolled (`unrolled_flops`), so
they are the FLOPs actually executed; the XLA count with the scans rolled is shown next to them.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, publish, machine, matmul_peak, perturbed, preset_command_line, time_call, train_step_row, unrolled_flops, xla_flops, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.attacks import linf as attacks  # pylint: disable=g-import-not-at-top
from jaxlab.diffusion import priors  # pylint: disable=g-import-not-at-top
from jaxlab.methods.diffusion_purification import evaluation  # pylint: disable=g-import-not-at-top
from jaxlab.methods.diffusion_purification import models  # pylint: disable=g-import-not-at-top
from jaxlab.methods.diffusion_purification import purification  # pylint: disable=g-import-not-at-top
from jaxlab.methods.diffusion_purification import rbgm  # pylint: disable=g-import-not-at-top
from jaxlab.methods.diffusion_purification import training  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("diffusion_purification")
  m, p, d, a = config.model, config.prior, config.diffusion, config.attack
  arch = p.architecture
  batch, eot, t_star = config.eval.batch_size, a.eot, d.t_star
  rng = jax.random.key(0)
  x_key, y_key, c_key, d_key, attack_key, noise_key = jax.random.split(rng, 6)

  classifier_model, classify = models.classifier(config)
  denoiser_model, denoise = models.denoiser(config)
  schedule = models.make_schedule(config)
  classifier_init = classifier_model.init(c_key)
  denoiser_init = denoiser_model.init(d_key)
  classifier_params = perturbed(classifier_init, jax.random.fold_in(noise_key, 0))
  denoiser_params = perturbed(denoiser_init, jax.random.fold_in(noise_key, 1))
  image_shape = (config.data.size, config.data.size, models.CHANNELS)
  x = jax.random.uniform(x_key, (batch, *image_shape), minval=-1.0, maxval=1.0)
  y = jax.random.randint(y_key, (batch,), 0, models.NUM_CLASSES, jnp.int32)

  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  denoiser_desc = (f"residual MLP width {arch.width}, {arch.num_blocks} blocks"
                   if p.denoiser == "residual_mlp" else
                   f"UNet base {arch.base_channels} channels, multipliers "
                   f"{tuple(arch.channel_multipliers)}")
  lines = [f"\n## diffusion_purification attacks and training ({args.preset} preset), "
           f"{machine()}{brief_mark(args)}\n\n",
           f"{config.data.size}x{config.data.size} digits, denoiser {denoiser_desc}, "
           f"classifier MLP hidden "
           f"{tuple(m.classifier_hidden)}; T = {p.num_steps}, t* = {t_star} ({t_star + 1} reverse "
           f"steps per purification); attack batch {batch}, EOT {eot}; train batch "
           f"{config.train.batch_size}. Random-initialised networks (+0.01 N(0, 1)). Matmul peak "
           f"(jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32. GFLOP counts are XLA's on "
           f"the functions with every scan unrolled (XLA counts a rolled scan body once: that "
           f"count is in the last column).\n\n",
           "| PGD step through the purifier | s/step | images x EOT / s | GFLOP/step | GFLOP/s | "
           "% of peak | XLA GFLOP, scans rolled |\n|---|---|---|---|---|---|---|\n"]

  logits = evaluation.defended_logits(config)

  def pgd_step(cp, dp, x_in, y_in, keys):
    def loss(x_adv, k):
      return jnp.sum(models.cross_entropy(logits(cp, dp, x_adv, k), y_in))
    return attacks.pgd_step(loss, x_in, x_in, keys[0], epsilon=a.epsilon, step_size=a.step_size,
                            bounds=evaluation.PIXEL_RANGE)

  step = jax.jit(pgd_step)
  protocols = [(f"stochastic white-box (EOT {eot})", attacks.stochastic_keys(attack_key, 1, eot)),
               ("DW-box (EOT 1, fixed keys)", attacks.fixed_keys(attack_key, 1))]
  eot_step_s = None
  for name, keys in protocols:
    step_args = (classifier_params, denoiser_params, x, y, keys)
    seconds = time_call(step, *step_args, repeats=cut(args, 10))
    flops = unrolled_flops(pgd_step, *step_args)
    rolled = xla_flops(pgd_step, *step_args)
    eot_step_s = seconds if eot_step_s is None else eot_step_s
    lines.append(f"| {name} | {seconds:.4f} | {batch * keys.shape[1] / seconds:.0f} | "
                 f"{flops / 1e9:.2f} | {flops / seconds / 1e9:.1f} | "
                 f"{100 * flops / seconds / 1e9 / peak:.1f}% | {rolled / 1e9:.3f} |\n")
    print(lines[-1], end="", flush=True)

  # Where one EOT step goes.
  t = jnp.full((batch,), t_star, jnp.int32)
  purify_keys = jax.random.split(attack_key, purification.num_keys(t_star))
  cotangent = jax.random.normal(jax.random.fold_in(noise_key, 2), x.shape)

  def purify(dp, x_in, keys, remat, unroll=d.unroll):
    return purification.purify(lambda x_t, s: denoise(dp, x_t, s), schedule, x_in, t_star, keys,
                               remat=remat, variance=d.variance, unroll=unroll,
                               parameterization=p.parameterization)

  def purify_grad(remat, unroll=d.unroll):
    return jax.jit(jax.grad(lambda x_in, dp, keys: jnp.vdot(purify(dp, x_in, keys, remat, unroll),
                                                            cotangent)))

  classifier_grad = jax.jit(jax.grad(
      lambda x_in, cp, y_in: jnp.sum(models.cross_entropy(classify(cp, x_in), y_in))))
  parts = [("denoiser forward (1 network call)", jax.jit(denoise), (denoiser_params, x, t)),
           (f"purifier forward ({t_star + 1} reverse steps)",
            jax.jit(lambda dp, x_in, keys: purify(dp, x_in, keys, True)),
            (denoiser_params, x, purify_keys)),
           (f"purifier forward + gradient w.r.t. x, one EOT draw (remat, unroll={d.unroll}, "
            "as evaluated)",
            purify_grad(True), (x, denoiser_params, purify_keys)),
           ("purifier forward + gradient w.r.t. x, one EOT draw (no remat)",
            purify_grad(False), (x, denoiser_params, purify_keys)),
           (f"purifier forward + gradient w.r.t. x, one EOT draw (remat, reverse scan "
            f"{'rolled' if d.unroll else 'unrolled'}, the other choice)",
            purify_grad(True, not d.unroll), (x, denoiser_params, purify_keys)),
           ("classifier forward + gradient w.r.t. x", classifier_grad,
            (x, classifier_params, y))]
  lines.append(f"\nWhere one stochastic white-box PGD step (EOT {eot}, "
               f"{1e3 * eot_step_s:.1f} ms) goes, each part jitted alone:\n\n"
               "| part | ms | % of the EOT step |\n|---|---|---|\n")
  for name, fn, fn_args in parts:
    ms = 1e3 * time_call(fn, *fn_args, repeats=cut(args, 10))
    lines.append(f"| {name} | {ms:.2f} | {100 * ms / (1e3 * eot_step_s):.1f}% |\n")
    print(lines[-1], end="", flush=True)

  # Training steps.
  train_batch = config.train.batch_size
  data = {"image": jax.random.uniform(x_key, (train_batch, *image_shape), minval=-1.0,
                                      maxval=1.0),
          "label": jax.random.randint(y_key, (train_batch,), 0, models.NUM_CLASSES, jnp.int32)}
  lines.append(f"\n| training step (batch {train_batch}) | steps/s | GFLOP/step | GFLOP/s | "
               "% of peak |\n|---|---|---|---|---|\n")
  iterations = config.addt.cgpo_iterations
  runs = [("DDPM pretraining", None), ("plain fine-tuning", "plain"),
          (f"ADDT without RBGM (CGPO {iterations} iterations, standardised guidance)",
           "addt_no_rbgm"),
          (f"ADDT fine-tuning (CGPO {iterations} iterations + RBGM)", "addt")]
  for name, perturbation in runs:
    if perturbation is None:
      experiment = priors.pretraining_experiment(models.prior_spec(config))
    else:
      experiment = training.diffusion_experiment(
          config, config.train.steps, perturbation=perturbation, init_params=denoiser_init,
          classifier_params=classifier_init)
    lines.append(train_step_row(name, experiment, data, rng, peak=peak, repeats=cut(args, 30),
                                count_flops=unrolled_flops))
    print(lines[-1], end="", flush=True)
  guidance = jax.random.normal(x_key, data["image"].shape)
  rbgm_ms = 1e3 * time_call(jax.jit(rbgm.rank_gaussian_map), guidance, rng,
                            repeats=cut(args, 30))
  lines.append(f"\nRBGM alone on one training batch ({train_batch} x {image_shape}): "
               f"{rbgm_ms:.1f} ms per call, {iterations} calls per ADDT step (one argsort of "
               f"{config.data.size ** 2} values per image and channel; XLA's CPU sort).\n")
  print(lines[-1], end="", flush=True)
  publish(lines, "diffusion_purification", write=writes_results(args))


if __name__ == "__main__":
  main()
