"""ctrl: seconds per RL update (rematerialised or not), sampling throughput, where an update goes.

  python benchmarks/ctrl_speed.py [--preset quick] [--no-append] [--brief]

Random-initialised priors of the preset's architectures (toy2d's and the digits' residual MLPs),
every parameter moved by 0.01 N(0, 1) and the LoRA B factors too, so that no zero-initialised
layer makes the work trivial; the reward is a fixed random MLP classifier. Prints, and writes to
benchmarks/RESULTS.md in place of this method's previous table:
* seconds per CTRL update (all `ctrl.num_seeds` seeds, vmapped, one jitted chunk of updates) with
  `jax.checkpoint` per sampling step on and off, the FLOPs of one update (XLA's count on the
  chain with its scan unrolled: a rolled scan body counts once) and GFLOP/s next to the matmul
  peak;
* samples per second of the tuned policy's chain (no gradient);
* the parts of one update, each jitted alone: one policy forward, the chain forward with its KL,
  and the reward classifier's forward and gradient.
There is no official figure: the official code fine-tunes Stable Diffusion.
"""
from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, perturbed, preset_command_line, publish, time_call, unrolled_flops, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.diffusion import priors  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import baselines  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import classifiers  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import finetune  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import tasks  # pylint: disable=g-import-not-at-top


def random_prior(spec: priors.PriorSpec, num_labels: int, key):
  """(reference apply, labelled apply, reference params) of a random prior of `spec`."""
  unlabelled, reference_apply = priors.network(spec)
  _, labelled_apply = priors.network(spec, num_labels=num_labels + 1)
  params = perturbed(unlabelled.init(key), jax.random.fold_in(key, 1))
  return reference_apply, labelled_apply, params


def task_rows(name, spec, num_labels, config, peak, args, key) -> list[str]:
  schedule = priors.make_schedule(spec)
  reference_apply, policy_apply, reference_params = random_prior(spec, num_labels, key)
  policy_params = perturbed(baselines.labelled_params(reference_params, num_labels),
                            jax.random.fold_in(key, 2))
  shape = spec.sample_shape
  model, classify = classifiers.mlp_classifier(shape, num_labels, tuple(config.reward.hidden))
  reward = classifiers.Classifier(apply=classify, params=model.init(jax.random.fold_in(key, 3)))
  rows = []
  # (remat, shared_time): the last row is the per-row-t chain that the quick runs before
  # 2026-12-07 used (Settings.shared_time).
  for remat, shared_time in ((True, True), (False, True), (False, False)):
    settings = finetune.Settings.from_config(
        config.ctrl, num_labels=num_labels, remat=remat, shared_time=shared_time,
        steps=cut(args, 8, 2),
        chunk_steps=cut(args, 8, 2), ckpt_every=cut(args, 8, 2))
    init, chunk = finetune._training_functions(  # pylint: disable=protected-access
        policy_apply, reference_apply, reward.log_prob, settings, tuple(shape),
        int(np.prod(shape)))
    seeds = jax.random.split(jax.random.fold_in(key, 4), settings.num_seeds)
    state = init(policy_params, seeds)
    n = settings.chunk_steps
    run = lambda s: chunk(s, policy_params, reference_params, schedule, 0, n)
    state, _ = run(state)   # compile
    jax.block_until_ready(state)
    times = []
    for _ in range(cut(args, 3, 1)):
      start = time.perf_counter()
      state, metrics = run(state)
      jax.block_until_ready(metrics)
      times.append((time.perf_counter() - start) / n)
    seconds = sorted(times)[len(times) // 2]

    def one_update(trained, k):
      def loss(t):
        labels = jax.random.randint(k, (settings.batch_size,), 0, num_labels)
        params = finetune.merged_params(t, policy_params, settings)
        x0, kl = finetune.sample_with_kl(policy_apply, params, reference_apply,
                                         reference_params, schedule, labels, k, settings, shape)
        return finetune.objective(settings, int(np.prod(shape)), reward.log_prob(x0, labels),
                                  kl)[0]
      return jax.grad(loss)(trained)
    trained = finetune.trainable_init(policy_params, settings, key)
    flops = unrolled_flops(one_update, trained, key) * settings.num_seeds
    gflops = flops / seconds / 1e9
    time_note = "" if shared_time else ", t per row"
    rows.append(f"| {name} | update, remat {'on' if remat else 'off'}{time_note} "
                f"({settings.num_seeds} "
                f"seeds x batch {settings.batch_size}, {settings.sample_steps} steps) | "
                f"{seconds:.3f} s | {flops / 1e9:.2f} | {gflops:.1f} | "
                f"{100 * gflops / peak:.1f}% |\n")
    print(rows[-1], end="", flush=True)

  settings = finetune.Settings.from_config(config.ctrl, num_labels=num_labels)
  num = cut(args, 2000, 64)
  labels = jnp.arange(num) % num_labels
  sample = jax.jit(lambda p, k: finetune.sample(policy_apply, p, reference_apply,
                                                reference_params, schedule, labels, k,
                                                settings, shape))
  seconds = time_call(sample, policy_params, key, repeats=cut(args, 5))
  rows.append(f"| {name} | sampling ({num} samples, {settings.sample_steps} steps, no grad) | "
              f"{num / seconds:.0f} samples/s | | | |\n")
  t = jnp.full((settings.batch_size,), spec.num_steps // 2, jnp.int32)
  x = jax.random.normal(key, (settings.batch_size, *shape))
  y = labels[:settings.batch_size]
  parts = [
      ("policy forward (1 network call)",
       jax.jit(lambda p: policy_apply(p, x, t, y)), (policy_params,)),
      ("chain forward with KL (no grad)",
       jax.jit(lambda p, k: finetune.sample_with_kl(policy_apply, p, reference_apply,
                                                    reference_params, schedule, y, k, settings,
                                                    shape)), (policy_params, key)),
      ("reward forward + grad wrt x0",
       jax.jit(jax.grad(lambda xs: jnp.sum(reward.log_prob(xs, y)))), (x,)),
  ]
  for label, fn, fn_args in parts:
    seconds = time_call(fn, *fn_args, repeats=cut(args, 10))
    rows.append(f"| {name} | {label} | {seconds * 1e3:.2f} ms | | | |\n")
  return rows


def main() -> None:
  args, config = preset_command_line("ctrl")
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  lines = [f"\n## ctrl RL updates and sampling ({args.preset} preset), {machine()}"
           f"{brief_mark(args)}\n\n",
           f"Random-initialised residual-MLP priors of the preset (+0.01 N(0, 1)), LoRA rank "
           f"{config.ctrl.lora_rank}, eta = {config.ctrl.eta}. Matmul peak (jitted 2048x2048 "
           f"jnp.dot): {peak:.0f} GFLOP/s float32. GFLOP per update: XLA's count of one seed's "
           f"update with the chain's scan unrolled, times the seeds. No official figure (the "
           f"official code fine-tunes Stable Diffusion).\n\n",
           "| task | what | time | GFLOP / update | GFLOP/s | % of peak |\n"
           "|---|---|---|---|---|---|\n"]
  for index, (name, group) in enumerate((("toy2d", config.toy2d), ("digits", config.digits))):
    spec = priors.PriorSpec.from_config(group.prior)
    num_labels = 2 if name == "toy2d" else tasks.NUM_DIGITS
    lines += task_rows(name, spec, num_labels, config, peak, args, jax.random.key(index))
  publish(lines, "ctrl", writes_results(args))


if __name__ == "__main__":
  main()
