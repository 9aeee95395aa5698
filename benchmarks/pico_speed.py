"""pico: seconds for one 30-step consistency fit at the paper's size, and the baselines.

  python benchmarks/pico_speed.py [--preset quick] [--no-append] [--brief]

Setting: one simulated peer-review set of the quick preset (15 models, 80 questions, about
52,000 judged battles). Prints, and writes to benchmarks/RESULTS.md in place of this method's
previous table: the 30-step fit (rank and Elo variants), 10 seeds vmapped, the elimination of
up to 8 reviewers, and Uniform, all compile excluded. The official figures are the log
timestamps on its machine: 7 min 15 s for the fit on the full data, 6 s for Uniform.

--brief (a smoke check; never writes RESULTS.md): the smoke preset, 1 timed call.
"""
from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import brief_mark, cut, machine, preset_command_line, publish, time_call, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.methods.pico import consistency  # pylint: disable=g-import-not-at-top
from jaxlab.methods.pico import data  # pylint: disable=g-import-not-at-top
from jaxlab.methods.pico import ranking  # pylint: disable=g-import-not-at-top
from jaxlab.methods.pico import simulate  # pylint: disable=g-import-not-at-top


def main() -> None:
  args, config = preset_command_line("pico")
  spec = simulate.calibrated_spec(data.disagreement_rate(),
                                  num_questions=int(config.sim.num_questions))
  battles = simulate.simulate(spec, 0)
  arrays = consistency.arrays(battles)
  settings = dict(num_models=15, num_steps=int(config.fit.num_steps))
  repeats = cut(args, 5, 1)
  keys = jax.random.split(jax.random.key(0), 10)
  seeds_fit = jax.jit(jax.vmap(lambda k: consistency.pico_fit(arrays, k, **settings)))
  rows = [
      ("PiCO fit (rank variant)", lambda: consistency.fit(arrays, jax.random.key(0), **settings)),
      ("PiCO fit (Elo variant)",
       lambda: consistency.fit(arrays, jax.random.key(0), variant="elo", **settings)),
      ("PiCO fit, 10 seeds vmapped", lambda: seeds_fit(keys)),
      ("elimination of up to 8 reviewers (9 fits)", lambda: consistency.eliminate(
          arrays, jax.random.key(0), max_eliminated=int(config.fit.max_eliminated), **settings)),
      ("Uniform", lambda: ranking.rank(battles, "uniform", true_order=np.arange(15))),
  ]
  lines = [f"\n## pico ({args.preset} preset), {machine()}{brief_mark(args)}\n\n",
           f"One simulated set: {battles.num_battles:,} judged battles of 15 models, "
           f"{settings['num_steps']} full-batch steps per fit; compile excluded. Official (log "
           "timestamps, their machine): 7 min 15 s for the fit on the full data, 6 s for "
           "Uniform.\n\n", "| what | seconds |\n|---|---|\n"]
  for label, fn in rows:
    seconds = time_call(lambda fn=fn: jax.block_until_ready(fn()), repeats=repeats)
    lines.append(f"| {label} | {seconds:.4f} |\n")
    print(lines[-1], end="", flush=True)
  publish(lines, "pico", writes_results(args))


if __name__ == "__main__":
  main()
