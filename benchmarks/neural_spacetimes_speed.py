"""Full-batch training speed of Neural SpaceTimes, and the distortion reached, vs the official code.

  python benchmarks/neural_spacetimes_speed.py [--epochs 5000] [--no-append] [--brief]
  python benchmarks/neural_spacetimes_speed.py --official ~/src/NeuralSpaceTimesICLR2025 \
      --official-python ~/venvs/nst/bin/python [--rounds 5] [--window 10]

With `--official DIR` (a checkout of haitzsaezdeocariz/NeuralSpaceTimesICLR2025; nothing is
downloaded) it instead times the official training beside ours on the reference setting below:
`neural_spacetimes_official_worker.py` runs the official `train` for 100 epochs per call in its own
process under `--official-python` (with `torch==2.13.0 networkx matplotlib pydot` and Graphviz's
`dot`), interleaved with our compiled 100-epoch chunk for `--rounds` rounds, for NST and Minkowski;
it prints seconds per 100 epochs (medians), the median per-round speed-up and the load average,
and writes that table to benchmarks/RESULTS.md in place of the previous side-by-side one (a block
of its own, "neural_spacetimes official", apart from the table of ours alone below).

--brief (a GPU smoke check; never writes RESULTS.md): every model and replica count as below, each
100-epoch chunk timed over 2 calls instead of 5, and the end-to-end fit of 500 epochs (one chunk)
instead of 5,000 (`--epochs` given explicitly wins), so the distortion it reaches does not compare
with the official 5,000-epoch figures.

Reference setting (the issue's): synthetic metric type 1, 50 nodes, p = 0.9 (~1,100 edges), seed
123, space and time dimension 2, encoder 10 x 100, quasi-metric and partial order of depth 4 and
width 10, AdamW lr 1e-4 (weight decay 0.01), clipping 0.5, every edge in every step. The official
PyTorch code on a 2-core CPU takes 5.4 s per 100 epochs (it encodes both endpoints of all 2,500
node pairs per step) and reaches a mean distortion of 1.093 (std 0.24, max 3.75, directionality
1.0) after 5,000 epochs.

Without it, prints, and writes to benchmarks/RESULTS.md in place of this method's previous
table of ours alone:
* seconds per 100 epochs in steady state (one jitted 100-epoch scan, compile excluded), for one
  graph and per graph when several replicas train together (vmapped), for NST and the baselines;
* one 5,000-epoch fit end to end (compile included) and the distortion it reaches;
* the layout that drew the graph (Graphviz dot, as the official code, when installed).
"""
from __future__ import annotations

import argparse
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import add_official_flags, beside_official, brief_mark, cut, parse_args, publish, machine, steps_per_second_for, time_call, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.core import replicas  # pylint: disable=g-import-not-at-top
from jaxlab.data import dags  # pylint: disable=g-import-not-at-top
from jaxlab.methods.neural_spacetimes import models  # pylint: disable=g-import-not-at-top
from jaxlab.methods.neural_spacetimes import objective  # pylint: disable=g-import-not-at-top
from jaxlab.methods.neural_spacetimes import training  # pylint: disable=g-import-not-at-top

OFFICIAL_S_PER_100 = 5.4
OFFICIAL_FINAL = {"distortion_mean": 1.093, "distortion_std": 0.24, "distortion_max": 3.75,
                  "directionality": 1.0}
SEED = 123


def chunk_call(spec: models.SpacetimeSpec, graph: dags.WeightedDag, num_replicas: int, mesh):
  """(one call = 100 epochs of every replica, compiled; compile seconds)."""
  schedule = training.Schedule(epochs=0, chunk_epochs=100, ckpt_every=0)
  keys = replicas.place(jax.random.split(jax.random.key(SEED), num_replicas), mesh)
  graphs = replicas.place(objective.graph_arrays([graph] * num_replicas), mesh)
  chunk = training.chunk_function(spec, schedule,
                                  replicas.replica_sharding(num_replicas, mesh))
  state = replicas.place(training.init_function(spec, schedule)(keys), mesh)
  args = (graphs, jnp.asarray(0), jnp.asarray(100))
  start = time.perf_counter()
  compiled = chunk.lower(state, *args).compile()
  compile_s = time.perf_counter() - start
  holder = {"state": state}

  def run_chunk():
    holder["state"], metrics = compiled(holder["state"], *args)
    return metrics
  return run_chunk, compile_s


def seconds_per_100(spec: models.SpacetimeSpec, graph: dags.WeightedDag, num_replicas: int,
                    mesh, repeats: int = 5) -> tuple[float, float]:
  """(steady-state seconds per 100 epochs of all replicas, compile seconds)."""
  run_chunk, compile_s = chunk_call(spec, graph, num_replicas, mesh)
  return time_call(run_chunk, repeats=repeats), compile_s


WORKER = pathlib.Path(__file__).resolve().parent / "neural_spacetimes_official_worker.py"


def side_by_side_lines(args, graph: dags.WeightedDag, mesh) -> list[str]:
  """Our 100-epoch chunk and the official `train` for 100 epochs, interleaved, per model."""
  rows, info = [], {}
  for kind, official_kind in (("nst", "nst"), ("minkowski", "min")):
    def make_ours(kind=kind):
      ours, _ = chunk_call(models.SpacetimeSpec(kind, 2), graph, 1, mesh)
      return lambda seconds: steps_per_second_for(ours, seconds)
    result, info = beside_official(args, WORKER, [f"--model={official_kind}"], make_ours)
    rows.append(result.seconds_row(kind, 1, digits=(3, 2)))
  return [f"\n## neural_spacetimes beside the official code, {machine()}, torch "
          f"{info.get('torch')} ({info.get('threads')} threads){brief_mark(args)}\n\n",
          f"Synthetic type 1, 50 nodes, dimension 2, full batch ({info.get('pairs')} pairs in "
          f"the official step, our {graph.num_edges} edges). Official: `{args.official}`, its "
          "`dag_train_functions.train` for 100 epochs per call "
          f"(`benchmarks/neural_spacetimes_official_worker.py`); {args.rounds} rounds of "
          f"{args.window:g} s windows, ours then official.\n\n",
          "| model | jaxlab s / 100 epochs | official s / 100 epochs | speed-up (median of "
          "rounds) | load before windows |\n|---|---|---|---|---|\n", *rows]


def main() -> None:
  parser = argparse.ArgumentParser()
  parser.add_argument("--epochs", type=int, default=5000)
  parser.add_argument("--no-append", action="store_true")
  add_official_flags(parser)
  args = parse_args(parser, epochs=500)
  host.tune_allocator()
  mesh = parallel.make_mesh()
  graph = dags.synthetic_dag("type1", num_nodes=50, p=0.9, seed=SEED)
  if args.official is not None:
    publish(side_by_side_lines(args, graph, mesh), "neural_spacetimes official",
            write=writes_results(args))
    return
  lines = [f"\n## neural_spacetimes full-batch training, {machine()}{brief_mark(args)}\n\n",
           f"Synthetic type 1, {graph.num_nodes} nodes, {graph.num_edges} edges, drawn by "
           f"`{graph.layout}`; encoder 10 x 100; every edge in every step. Official PyTorch code "
           f"(2-core CPU): {OFFICIAL_S_PER_100} s per 100 epochs.\n\n",
           "| model | dim | graphs per call | s / 100 epochs (all graphs) | s / 100 epochs per "
           "graph | compile s |\n|---|---|---|---|---|---|\n"]
  for kind in models.MODELS:
    for num_replicas in (1, 5):
      spec = models.SpacetimeSpec(kind, 2)
      seconds, compile_s = seconds_per_100(spec, graph, num_replicas, mesh,
                                           repeats=cut(args, 5))
      lines.append(f"| {kind} | 2 | {num_replicas} | {seconds:.3f} | "
                   f"{seconds / num_replicas:.3f} | {compile_s:.1f} |\n")
      print(lines[-1], end="", flush=True)

  spec = models.SpacetimeSpec("nst", 2)
  schedule = training.Schedule(epochs=args.epochs, chunk_epochs=500, ckpt_every=args.epochs)
  start = time.perf_counter()
  fit = training.fit(spec, objective.graph_arrays([graph]), jax.random.split(
      jax.random.key(SEED), 1), schedule, mesh=parallel.make_mesh(devices=jax.devices()[:1]),
                     progress=False)
  wall = time.perf_counter() - start
  final = {name: float(value[0]) for name, value in fit.metrics.items()}
  lines.append(f"\nOne NST fit of {args.epochs} epochs end to end (fresh compile in this "
               f"process, seed {SEED}): {wall:.1f} s. Reached vs official after 5,000 epochs:\n\n"
               "| metric | jaxlab | official |\n|---|---|---|\n")
  for name, value in final.items():
    lines.append(f"| {name} | {value:.3f} | {OFFICIAL_FINAL[name]} |\n")
  publish(lines, "neural_spacetimes", write=writes_results(args))


if __name__ == "__main__":
  main()
