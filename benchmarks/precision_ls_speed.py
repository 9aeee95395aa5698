"""Train-step speed of precision_ls models against this machine's matmul peak.

  python benchmarks/precision_ls_speed.py [--steps 40] [--batch 1024] [--no-append] [--brief]
  python benchmarks/precision_ls_speed.py --official ~/src/precision-ls \
      --official-python ~/venvs/precision-ls/bin/python [--rounds 5] [--window 5] [--cpu-devices 2]

With `--official DIR` (a checkout of HazyResearch/precision-ls; nothing is downloaded) it times
the official `train_step` beside ours instead: `precision_ls_official_worker.py` runs it in its own
process under `--official-python` (an environment with `torch==2.13.0 einops munch numpy pyyaml
tqdm`), and each row alternates windows of ours and the official step for `--rounds` rounds,
printing both medians, the median of the per-round ratios and the load average before each
window. Rows: BaseConv, softmax attention with 1 head (the official model) and 4 heads, float32
and float64, ours with and without microbatching, and microbatched as `--cpu-devices` CPU devices
(default one per core: one batch shard per device, as `--cpu_devices` runs an experiment); both
sides time one step on a fixed batch.
That table replaces the previous side-by-side one in benchmarks/RESULTS.md (a block of its own,
"precision_ls official", apart from the table of ours alone below). It is the comparison with the
official code: both sides measured on the same machine, in adjacent windows.

Reference configuration (the paper's explicit-gradient setting): 3 layers, width 64, no MLP, no
LayerNorm, d=5, n=20, batch 1024, Adam with the recipe (eps 1e-16, EMA filter). Prints steps/s and
achieved GFLOP/s (XLA's cost analysis of the compiled step) for BaseConv (Toeplitz and FFT long
convolution) and softmax attention, in float32 and float64, next to a jitted 2048x2048 matmul, and
writes the table to benchmarks/RESULTS.md in place of the previous table of ours alone.
"Official (other machine)" is not measured here: it is the figure quoted in the issue for the
official PyTorch code on another 2-core CPU, 5.3 / 3.2 steps/s (BaseConv f32 / f64) and 13.0 / 5.5
(softmax f32 / f64), on a machine whose float32 matmul peak is about 470 GFLOP/s; `--official`
measures the official step here instead. "Ceiling" is the rate at which the step's FLOPs would run
at this machine's matmul peak: no implementation can exceed it. "Microbatch" rows compute the same
batch-1024 gradient as 8 accumulated microbatches of 128 (`jaxlab/core/microbatch.py`): each
microbatch's activations fit the 2 MiB of per-core L2 cache, which the whole batch's do not.

--brief (a GPU smoke check; never writes RESULTS.md): every row as above, each step timed over 4
windows of 1 step (`--steps 4`) on batch 256 (2 microbatches of 128) unless `--steps` / `--batch`
are given, which win; the official (other machine) column stays the batch-1024 figures.
"""
from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import platform
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from benchmarks.common import SIDE_BY_SIDE_COLUMNS, OfficialWorker, add_official_flags, brief_mark, cut, matmul_peak, parse_args, publish, seconds_per_update, side_by_side, steps_per_second_for, versions, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.core import parallel  # pylint: disable=g-import-not-at-top
from jaxlab.data import least_squares  # pylint: disable=g-import-not-at-top
from jaxlab.methods.precision_ls import training  # pylint: disable=g-import-not-at-top

# The official code's steps/s quoted in the issue, from another 2-core CPU (not measured here;
# `--official DIR` times the official step on this machine).
OFFICIAL_STEPS_PER_S = {("baseconv", "float32"): 5.3, ("baseconv", "float64"): 3.2,
                        ("softmax", "float32"): 13.0, ("softmax", "float64"): 5.5}


def step_config(arch: str, conv_impl: str, precision: str, batch: int, microbatch: int = 0,
                heads: int = 4):
  c = config_lib.load_config(
      pathlib.Path(__file__).resolve().parents[1] / "configs" / "precision_ls.py", "quick")
  mixer = "baseconv" if arch == "baseconv" else "softmax_attention"
  return config_lib.with_overrides(c, {
      "precision": precision,
      "model": dict(mixer=mixer, width=64, depth=3, num_heads=1 if arch == "baseconv" else heads,
                    use_mlp=False, use_layernorm=False, final_layernorm=False,
                    conv_impl=conv_impl),
      "optim": dict(eps=1e-16, ema_strength=2.0, schedule="adaptive"),
      # One replica on a fixed batch: the step the official figures time.
      "data": dict(fresh=False),
      "train": dict(batch_size=batch, microbatch=microbatch, num_seeds=1)})


def step_flops(config, state, batch_data) -> float:
  """FLOPs of one step as XLA counts them, without the gradient-statistics branch (which the
  cost analysis would count although it runs only every `stats_every` steps), counted on the
  whole-batch step (XLA counts a scan's body once, so a microbatched step would read 1/8)."""
  config = config_lib.with_overrides(config, {"optim": {"schedule": "step"},
                                              "train": {"microbatch": 0}})
  update = jax.jit(training.make_experiment(config).update)
  compiled = update.lower(state, batch_data, jax.random.key(2)).compile()
  return (compiled.cost_analysis() or {}).get("flops", float("nan"))


def bench_step(arch: str, conv_impl: str, precision: str, batch: int, steps: int,
               microbatch: int = 0):
  config = step_config(arch, conv_impl, precision, batch, microbatch)
  dtype = training.dtype_of(config)
  with jax.enable_x64(precision == "float64"):
    experiment = training.make_experiment(config)
    state = jax.jit(experiment.init)(jax.random.key(0))
    # Step 1 onwards: the gradient-statistics probe runs every `stats_every` steps, not here.
    state["step"] = jnp.ones([], jnp.int32)
    batch_data = least_squares.sample_problems(jax.random.key(1), batch, 20, 5, dtype=dtype)
    flops = step_flops(config, state, batch_data)
    update = jax.jit(experiment.update, donate_argnums=0)
    seconds = seconds_per_update(update, state, batch_data, steps, windows=4)
  return 1.0 / seconds, flops


def our_step(arch: str, precision: str, batch: int, microbatch: int, heads: int,
             devices: int = 1):
  """One call = one jitted training step on a fixed batch (the state advances, donated). With
  `devices` > 1 the step is data-parallel over that many CPU devices (state replicated, batch
  sharded), as the experiments run it under `--cpu_devices`."""
  config = step_config(arch, "toeplitz", precision, batch, microbatch, heads)
  experiment = training.make_experiment(config)
  mesh = jax.sharding.Mesh(np.asarray(jax.devices()[:devices]), (parallel.DATA_AXIS,))
  replicated = parallel.replicated(mesh)
  holder = {"state": jax.jit(experiment.init, out_shardings=replicated)(jax.random.key(0))}
  holder["state"]["step"] = jax.device_put(jnp.ones([], jnp.int32), replicated)   # past the statistics probe at step 0
  data = parallel.shard_batch(least_squares.sample_problems(
      jax.random.key(1), batch, 20, 5, dtype=training.dtype_of(config)), mesh)
  update = jax.jit(experiment.update, donate_argnums=0)

  def step():
    holder["state"], metrics = update(holder["state"], data, jax.random.key(2))
    return metrics["loss"]
  jax.block_until_ready(step())   # compile
  return step


WORKER = pathlib.Path(__file__).resolve().parent / "precision_ls_official_worker.py"


def side_by_side_table(args) -> str:
  """Ours and the official step, interleaved, per (model, dtype, microbatch)."""
  rows, info = [], {}
  devices = args.cpu_devices
  settings = [("baseconv", 1, 0, 1), ("baseconv", 1, args.microbatch, 1),
              ("baseconv", 1, args.microbatch, devices), ("softmax", 1, 0, 1),
              ("softmax", 1, args.microbatch, 1), ("softmax", 1, args.microbatch, devices),
              ("softmax", 4, 0, 1), ("softmax", 4, args.microbatch, 1),
              ("softmax", 4, args.microbatch, devices)]
  settings = list(dict.fromkeys(settings))   # --cpu-devices 1 repeats the one-device rows
  for precision in ("float32", "float64"):
    workers = {}
    try:
      for arch, heads, microbatch, our_devices in settings:
        key = (arch, heads)
        if key not in workers:
          workers[key] = OfficialWorker(
              args.official_python or sys.executable, WORKER, f"--official={args.official}",
              f"--mixer={'base_conv' if arch == 'baseconv' else 'attn'}", f"--heads={heads}",
              f"--dtype={precision}", f"--batch={args.batch}")
          info = workers[key].info
        with jax.enable_x64(precision == "float64"):
          ours = our_step(arch, precision, args.batch, microbatch, heads, our_devices)
          result = side_by_side(lambda s: steps_per_second_for(ours, s),
                                workers[key].steps_per_second, rounds=args.rounds,
                                window=args.window)
        rows.append(f"| {arch} | {heads if arch == 'softmax' else '-'} | {precision} | "
                    f"{microbatch or '-'} | {our_devices} | {result.row_cells()} |\n")
        print(rows[-1], end="", flush=True)
    finally:
      for worker in workers.values():
        worker.close()
  torch_version = f"torch {info.get('torch')} ({info.get('threads')} threads)"
  header = (f"\n## precision_ls train step beside the official code, {datetime.date.today()} "
            f"({platform.machine()}, {os.cpu_count()} cores, {versions([torch_version])}, "
            f"batch {args.batch}){brief_mark(args)}\n\n"
            f"Official: `{args.official}` ({official_commit(args.official)}), its `train_step` "
            f"on a fixed batch (`benchmarks/precision_ls_official_worker.py`). {args.rounds} "
            f"rounds of {args.window:g} s windows, ours then official.\n\n"
            f"Our CPU devices: 1 is XLA's default (one device, each op split over the "
            f"cores); {args.cpu_devices} is the data-parallel step with one batch shard per "
            f"device (`--cpu_devices`).\n\n"
            f"| model | heads | dtype | our microbatch | our CPU devices | "
            f"{SIDE_BY_SIDE_COLUMNS} |\n"
            "|---|---|---|---|---|---|---|---|---|\n")
  return header + "".join(rows)


def official_commit(checkout: pathlib.Path) -> str:
  try:
    return subprocess.run(["git", "-C", str(checkout), "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True, check=True).stdout.strip()
  except (OSError, subprocess.CalledProcessError):
    return "commit unknown"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=40)
  parser.add_argument("--batch", type=int, default=1024)
  parser.add_argument("--microbatch", type=int, default=128,
                      help="the accumulated-microbatch rows' microbatch size")
  parser.add_argument("--no-append", action="store_true")
  parser.add_argument("--cpu-devices", type=int, default=os.cpu_count() or 1,
                      help="side by side: also time our microbatched step data-parallel over "
                           "this many CPU devices (default: one per core)")
  add_official_flags(parser)
  args = parse_args(parser, steps=4, batch=256)
  host.tune_allocator()
  host.use_cpu_devices(args.cpu_devices)
  if args.official is not None:
    publish([side_by_side_table(args)], "precision_ls official", write=writes_results(args))
    return

  with jax.enable_x64(True):
    peak = {"float32": matmul_peak(jnp.float32, repeats=cut(args, 10)),
            "float64": matmul_peak(jnp.float64, repeats=cut(args, 10))}
  rows = []
  settings = [("baseconv", "toeplitz", 0), ("baseconv", "toeplitz", args.microbatch),
              ("baseconv", "fft", args.microbatch), ("softmax", "-", 0),
              ("softmax", "-", args.microbatch)]
  for arch, impl, microbatch in settings:
    for precision in ("float32", "float64"):
      steps_per_s, flops = bench_step(arch, impl if impl != "-" else "toeplitz", precision,
                                      args.batch, args.steps, microbatch)
      gflops = flops * steps_per_s / 1e9
      key = (arch, precision)
      rows.append(
          f"| {arch} | {impl} | {microbatch or '-'} | {precision} | {steps_per_s:.1f} | "
          f"{peak[precision] * 1e9 / flops:.0f} | {OFFICIAL_STEPS_PER_S[key]:.1f} | "
          f"{steps_per_s / OFFICIAL_STEPS_PER_S[key]:.1f}x | {gflops:.1f} | "
          f"{100 * gflops / peak[precision]:.1f}% |\n")

  header = (f"\n## precision_ls train step, {datetime.date.today()} "
            f"({platform.machine()}, {os.cpu_count()} cores, {jax.devices()[0].platform}, "
            f"jax {jax.__version__}, batch {args.batch}){brief_mark(args)}\n\n"
            f"Matmul peak (jitted 2048x2048 jnp.dot): {peak['float32']:.0f} GFLOP/s float32, "
            f"{peak['float64']:.0f} GFLOP/s float64. Steps/s: median of 4 windows of "
            f"{args.steps // 4} steps.\n\n"
            "| model | long conv | microbatch | dtype | steps/s | "
            "ceiling (FLOPs at matmul peak) | official (other machine) | vs official | "
            "GFLOP/s | % of matmul peak |\n"
            "|---|---|---|---|---|---|---|---|---|---|\n")
  publish([header, *rows], "precision_ls", write=writes_results(args))


if __name__ == "__main__":
  main()
