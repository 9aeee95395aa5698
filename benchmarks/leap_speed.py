"""leap: environment steps per second, training steps per second by replica count, relabelled
examples per second, and a training step's profile.

  python benchmarks/leap_speed.py [--preset quick] [--no-append] [--brief]

Setting: the preset's game, decoder and batch. Prints, and writes to benchmarks/RESULTS.md in
place of this method's previous table:
* environment steps per second: the reference teachers (expert, teacher alone, Bayes-optimal)
  playing the preset's training games, vmapped over episodes, one jitted call;
* replica-steps per second of the compiled training chunk (`chunk_steps` AdamW steps in a
  `lax.scan`, vmapped over replicas) for 1, 3 and 21 replicas (21: the quick preset's 7
  students x 3 seeds), compile excluded, with achieved GFLOP/s (XLA's count of one replica's
  step) beside the measured matmul peak;
* relabelled examples per second: every replica's student playing the training games greedily
  and its teacher relabelling every step (what one DAgger round costs before training);
* one step's loss and gradient, jitted alone.
No official figure can be measured offline: the official code needs GPT-4o and ALFWorld.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 1 and 2 replicas, 1 timed call.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, writes_results, xla_flops  # pylint: disable=g-import-not-at-top
from experiments import leap as leap_experiment  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.core import replicas as replicas_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.leap import env as env_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.leap import student as student_lib  # pylint: disable=g-import-not-at-top
from jaxlab.methods.leap import training  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("leap")
  s = leap_experiment.settings(config)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  mesh = parallel.make_mesh()
  tasks = env_lib.sample_tasks(s.env, jax.random.key(0), config.data.train_tasks)
  episodes = config.data.train_tasks
  lines = [f"\n## leap environment, training and relabelling ({args.preset} preset), "
           f"{machine()}{brief_mark(args)}\n\n",
           f"Game: {s.env.num_receptacles} receptacles, horizon {s.env.horizon}, {episodes} "
           f"training games. Decoder width {s.model.width}, {s.model.depth} blocks, MLP "
           f"{s.model.mlp_dim}; batch {s.train.batch_size} episodes of {s.env.length} tokens; "
           f"chunks of {s.train.chunk_steps} steps. Matmul peak (jitted 2048x2048 jnp.dot): "
           f"{peak:.0f} GFLOP/s float32. No official figure (it needs GPT-4o and ALFWorld).\n\n",
           "| what | replicas | time | rate | GFLOP/s | % of peak |\n|---|---|---|---|---|---|\n"]

  references = lambda: training.play_references(s.env, tasks, jax.random.key(1))
  seconds = time_call(references, repeats=cut(args, 3, 1))
  env_steps = len(training.REFERENCE_TEACHERS) * episodes * s.env.horizon
  lines.append(f"| environment: {len(training.REFERENCE_TEACHERS)} teachers x {episodes} games x "
               f"{s.env.horizon} steps | - | {seconds * 1e3:.1f} ms | "
               f"{env_steps / seconds:,.0f} env steps/s | | |\n")
  print(lines[-1], end="", flush=True)

  demos = training.demonstrations(jax.tree.map(lambda a: a[0], references()))
  agent = student_lib.Student(s.model, s.env)
  batch = jax.tree.map(lambda a: jnp.asarray(a[:s.train.batch_size]), demos)

  def one_step(params):
    return jax.grad(lambda p: training.sft_loss(agent.action_logits(p, batch.tokens),
                                                batch.chosen))(params)

  params = agent.init(jax.random.key(0))
  step_flops = xla_flops(one_step, params)
  for count in cut(args, (1, 3, 21), (1, 2)):
    start = jax.vmap(agent.init)(jax.random.split(jax.random.key(0), count))
    phase = training.stack_phase([demos] * count, demos.size,
                                 learning_rates=[1e-3] * count, is_dpo=[False] * count,
                                 betas=[0.1] * count)
    sharding = replicas_lib.replica_sharding(count, mesh)
    init, chunk = training._phase_functions(  # pylint: disable=protected-access
        s.model, s.env, s.train, sharding)
    keys = jax.random.split(jax.random.key(1), count)
    placed_keys, placed_phase = replicas_lib.place((keys, jax.tree.map(jnp.asarray, phase)),
                                                   mesh)
    holder = {"state": replicas_lib.place(init(start), mesh)}
    n = s.train.chunk_steps

    def run():
      holder["state"], metrics = chunk(holder["state"], placed_keys, placed_phase,
                                       jnp.asarray(0), jnp.asarray(n))
      return metrics
    seconds = time_call(run, repeats=cut(args, 3, 1)) / n
    rate = count / seconds
    gflops = step_flops * rate / 1e9
    lines.append(f"| training step (chunk of {n}) | {count} | {seconds * 1e3:.1f} ms | "
                 f"{rate:.1f} replica-steps/s | {gflops:.1f} | {100 * gflops / peak:.1f}% |\n")
    print(lines[-1], end="", flush=True)

    choices = training.TeacherChoice(is_share=np.zeros(count, bool),
                                     percent=np.zeros(count, np.float32))
    relabel = lambda: training.play_and_relabel(s.model, s.env, holder["state"]["params"],
                                                choices, tasks, keys)
    seconds = time_call(relabel, repeats=cut(args, 2, 1))
    labelled = count * episodes * s.env.horizon
    lines.append(f"| play greedily + relabel every step ({episodes} games) | {count} | "
                 f"{seconds * 1e3:.1f} ms | {labelled / seconds:,.0f} relabelled steps/s | | |\n")
    print(lines[-1], end="", flush=True)

  seconds = time_call(jax.jit(one_step), params, repeats=cut(args, 20, 2))
  lines.append(f"| loss + gradient (one batch) | 1 | {seconds * 1e3:.2f} ms | | "
               f"{step_flops / seconds / 1e9:.1f} | {100 * step_flops / seconds / 1e9 / peak:.1f}%"
               " |\n")
  print(lines[-1], end="")
  publish(lines, "leap", writes_results(args))


if __name__ == "__main__":
  main()
