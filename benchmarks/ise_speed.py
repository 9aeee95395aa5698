"""ise: training steps per second by replica count, greedy answers per second, a step's profile.

  python benchmarks/ise_speed.py [--preset quick] [--no-append] [--brief]

Setting: the preset's decoder, batch and pool (packed rows of 64 tokens, 2-3 conversations each;
the quick preset's conversations have up to 2 turns). Prints, and writes to benchmarks/RESULTS.md in place of this method's previous
table:
* replica-steps per second of the compiled training chunk (`chunk_steps` AdamW steps in a
  `lax.scan`, vmapped over replicas) for 1, 3 and 9 replicas (9: the quick preset's 3 variants x
  3 seeds), compile excluded, with achieved GFLOP/s (XLA's count of one replica's step) next to
  the measured matmul peak;
* greedy answers per second (9 decoding steps of a full forward pass each, one replica, 300
  prompts);
* one step's forward and backward, each jitted alone.
No official figure can be measured offline: the official code fine-tunes Llama-3.1-8B on 4 GPUs.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 1 and 2 replicas, 1 timed call.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, writes_results, xla_flops  # pylint: disable=g-import-not-at-top
from experiments import ise as ise_experiment  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.core import replicas as replicas_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ise import evaluation  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ise import tasks  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ise import training  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("ise")
  model_spec, train_spec, regimes, variants, _ = ise_experiment.specs(config)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  mesh = parallel.make_mesh()
  pools = training.build_pools(regimes[:1], variants, size=min(config.data.pool_size, 4096),
                               max_turns=config.data.max_turns, seed=0)
  net = training.model_lib.network(model_spec)
  tokens, segments, loss_mask, positions, docs = (jnp.asarray(a[0, :train_spec.batch_size])
                                                  for a in pools.arrays())
  mask = training.packed_mask(docs)
  apply = lambda p: net.apply(p, tokens, segments, 1.0, positions=positions, mask=mask)

  def one_step(params):
    def loss(p):
      return training.masked_loss(apply(p), tokens, loss_mask)[0]
    return jax.grad(loss)(params)

  params = net.init(jax.random.key(0))
  step_flops = xla_flops(one_step, params)
  lines = [f"\n## ise training and decoding ({args.preset} preset), {machine()}{brief_mark(args)}"
           "\n\n",
           f"Decoder width {model_spec.width}, {model_spec.depth} blocks, {model_spec.num_heads} "
           f"heads, MLP {model_spec.mlp_dim}; batch {train_spec.batch_size} of up to "
           f"{tasks.MAX_TOKENS} tokens; chunks of {train_spec.chunk_steps} steps. Matmul peak "
           f"(jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32. GFLOP per step: XLA's count "
           "of one replica's loss and gradient. No official figure (it fine-tunes an 8B model on "
           "4 GPUs).\n\n",
           "| what | replicas | time | replica-steps/s | GFLOP/s | % of peak |\n"
           "|---|---|---|---|---|---|\n"]
  counts = cut(args, (1, 3, 9), (1, 2))
  for count in counts:
    seeds = list(range(count))
    layout = [training.Replica(regimes[0], variants[i % len(variants)], s)
              for i, s in enumerate(seeds)]
    sharding = replicas_lib.replica_sharding(count, mesh)
    _, init, chunk = training._functions(  # pylint: disable=protected-access
        model_spec, train_spec, sharding)
    keys, pool_index, use_segments = training.replica_inputs(layout, pools, regimes[:1])
    arrays = tuple(jnp.asarray(a) for a in pools.arrays())
    holder = {"state": replicas_lib.place(init(keys), mesh)}
    n = train_spec.chunk_steps

    def run():
      holder["state"], metrics = chunk(holder["state"], keys, pool_index, use_segments, arrays,
                                       jnp.asarray(0), jnp.asarray(n))
      return metrics
    seconds = time_call(run, repeats=cut(args, 3, 1)) / n
    rate = count / seconds
    gflops = step_flops * rate / 1e9
    lines.append(f"| training step (chunk of {n}) | {count} | {seconds * 1e3:.1f} ms | "
                 f"{rate:.1f} | {gflops:.1f} | {100 * gflops / peak:.1f}% |\n")
    print(lines[-1], end="", flush=True)

  num = cut(args, 300, 16)
  sets = evaluation.suite(0, num, config.data.max_turns)
  data = training.eval_set(sets["completion"], variants[-1])
  generate = training.generate_function(model_spec)
  args_ = (params, jnp.asarray(1.0), jnp.asarray(data.tokens), jnp.asarray(data.segments),
           jnp.asarray(data.prompt_len))
  seconds = time_call(generate, *args_, repeats=cut(args, 5, 1))
  lines.append(f"| greedy answers ({training.ANSWER_SLOTS} steps, {num} prompts) | 1 | "
               f"{seconds * 1e3:.1f} ms | {num / seconds:.0f} answers/s | | |\n")
  forward = jax.jit(apply)
  for label, fn in (("forward (one batch)", forward), ("loss + gradient (one batch)",
                                                        jax.jit(one_step))):
    seconds = time_call(fn, params, repeats=cut(args, 20, 2))
    lines.append(f"| {label} | 1 | {seconds * 1e3:.2f} ms | | | |\n")
  print("".join(lines[-3:]), end="")
  publish(lines, "ise", writes_results(args))


if __name__ == "__main__":
  main()
