"""reward_reduction: intersection steps per second, and agent steps per second per method.

  python benchmarks/reward_reduction_speed.py [--preset quick] [--no-append] [--brief]

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* environment decisions per second, 64 intersections vmapped, random phases, one scanned
  episode of 200 decisions per call;
* per method, agent steps per second (one environment step, one envelope update of 32 x 4, the
  reduction's update every 5 steps) of the preset's seeds vmapped in one scanned chunk, i.e.
  replica-updates per second; the FLOPs of one agent step (XLA's count of a one-step chunk
  jitted alone) and the achieved GFLOP/s next to the measured matmul peak.

No PyTorch reference is timed: the official code needs SUMO, and the issue's PyTorch rewrite of
the step is not written yet.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 1 timed call a row.

Before 2026-12-08 this hung, idle, when a method's state was initialised: the Q-networks'
seed-batched QRs deadlocked XLA:CPU's thread pool (`agent.q_params`, method README).
"""
from __future__ import annotations

import dataclasses
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, matmul_peak, preset_command_line, publish, time_call, writes_results  # pylint: disable=g-import-not-at-top
from experiments import reward_reduction as experiment  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.core import replicas  # pylint: disable=g-import-not-at-top
from jaxlab.methods.reward_reduction import agent  # pylint: disable=g-import-not-at-top
from jaxlab.methods.reward_reduction import traffic  # pylint: disable=g-import-not-at-top
from jaxlab.methods.reward_reduction import training  # pylint: disable=g-import-not-at-top

NUM_ENVS = 64


def main() -> None:
  args, config = preset_command_line("reward_reduction")
  names, traffic_config, settings = experiment.options(config)
  env_params = traffic.demand(0, traffic_config)
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  repeats = cut(args, 3, to=1)

  def episode(key):
    state, _ = traffic.reset(key, env_params, traffic_config)

    def body(state, t):
      action = jax.random.randint(jax.random.fold_in(key, t), (), 0, traffic.NUM_PHASES)
      state, _, reward, _ = traffic.step(state, action, key, env_params, traffic_config)
      return state, reward
    return jax.lax.scan(body, state, jnp.arange(traffic_config.episode_decisions))[1].sum()

  episodes = jax.jit(jax.vmap(episode))
  keys = jax.random.split(jax.random.key(0), NUM_ENVS)
  env_seconds = time_call(episodes, keys, repeats=cut(args, 10))
  decisions = NUM_ENVS * traffic_config.episode_decisions
  seeds = list(range(config.num_seeds))
  mesh = parallel.make_mesh(config.mesh)
  lines = [f"\n## reward_reduction ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"Point-queue intersection: {NUM_ENVS} vmapped, {decisions / env_seconds:,.0f} "
           f"decisions/s ({1e6 * env_seconds / decisions:.2f} us each). Agent: Q "
           f"{tuple(config.agent.hidden)}, batch {config.agent.batch_size} x "
           f"{config.agent.num_sample_w} preferences, {len(seeds)} seeds vmapped in one scanned "
           f"chunk of {config.train.chunk_steps} steps (median of the {repeats} chunks "
           f"after the first, compiling one). Matmul peak (jitted "
           f"2048x2048 jnp.dot): {peak:.0f} GFLOP/s float32. GFLOP per step: XLA's count of a "
           "one-step chunk jitted alone.\n\n",
           "| method | agent steps/s (all seeds) | replica-updates/s | GFLOP/step/replica | "
           "GFLOP/s | % of peak |\n|---|---|---|---|---|---|\n"]
  for name in names:
    s = settings[name]
    chunk = training.chunk_function(s, replicas.replica_sharding(len(seeds), mesh))
    init = training.init_function(s)
    seed_keys = training.seed_keys(seeds)
    # As the experiment runs: the first chunk (compiling, 200 random steps included) from a
    # fresh state, then the timed chunks continue from it.
    state = init(env_params, seed_keys)
    times = []
    for index in range(repeats + 1):
      start = jnp.asarray(index * s.chunk_steps)
      begin = time.perf_counter()
      state, metrics = chunk(state, seed_keys, env_params, start, start + s.chunk_steps)
      jax.block_until_ready(metrics)
      times.append(time.perf_counter() - begin)
    start_step = jnp.asarray(s.learning_starts)
    seconds = sorted(times[1:])[len(times[1:]) // 2]
    steps_per_s = s.chunk_steps / seconds
    one_state = jax.tree.map(lambda leaf: leaf[0], init(env_params, seed_keys))
    one_step = agent.replica_chunk(dataclasses.replace(s, chunk_steps=1))
    compiled = jax.jit(one_step).lower(one_state, seed_keys[0], env_params, start_step,
                                       start_step + 1).compile()
    flops = (compiled.cost_analysis() or {}).get("flops", float("nan"))
    gflops = flops * steps_per_s * len(seeds) / 1e9
    lines.append(f"| {name} | {steps_per_s:,.0f} | {steps_per_s * len(seeds):,.0f} | "
                 f"{flops / 1e9:.4f} | {gflops:.1f} | {100 * gflops / peak:.1f}% |\n")
    print(lines[-1], end="", flush=True)
  publish(lines, "reward_reduction", writes_results(args))


if __name__ == "__main__":
  main()
