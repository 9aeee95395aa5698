"""Training speed of the flow_mi estimators, end-to-end `estimate` time, and a step profile.

  python benchmarks/flow_mi_speed.py [--estimate-steps 500] [--no-append] [--brief]
  python benchmarks/flow_mi_speed.py --official DIR --official-python PATH [--rounds 5] [--window 5]

--official DIR (a local checkout of calebdahlke/FlowMI; nothing is downloaded) times the official
JVF and NVF training loops beside ours instead, interleaved, in the official code's own pinned
environment (`benchmarks/flow_mi_official_worker.py` says which entry point and how to build the
environment): ours is the compiled 250-step chunk with its held-out evaluation, theirs the
estimator's training loop timed by its own `Run Time` (a held-out evaluation every 250 steps too).
The table goes to the "flow_mi official" block of RESULTS.md.

--brief (a GPU smoke check; never writes RESULTS.md): every estimator timed over one 250-step chunk
instead of four (scaled to 1,000 steps), `--estimate-steps` 250 unless given (one chunk), the step
profile over 5 calls instead of 50.

Reference setting (the issue's): the 5x5 dense Gaussian (off-diagonal 0.5), N = 10,000 (5,000 to
train), batch 256, one masked-autoregressive RQ-spline layer of width 8 and depth 2, 128 bins on
[-8, 8], dropout 0.2 (the official defaults). The official JAX/Equinox code on a 2-core CPU needs
34 s (JVF) and 36 s (NVF) per 1,000 steps, and 36 s / 49 s for one estimate end to end (about
20 s of it compilation). The step count of that end-to-end figure is not given; 36 s - 20 s of
compilation at 34 s / 1,000 steps is ~500 steps, so `--estimate-steps` defaults to 500.

Prints, and writes to benchmarks/RESULTS.md in place of this method's previous table:
* seconds per 1,000 steps of every trained estimator (steady state: four 250-step chunks, each
  with its held-out evaluation), compile time of the chunk, achieved GFLOP/s (XLA's cost
  analysis) next to the machine's matmul peak;
* one `estimate()` call end to end, in a fresh process (cold compile), for JVF and NVF;
* where one JVF step goes: minibatch draw, forward (flows + loss), gradient, optimiser.
"""
from __future__ import annotations

import argparse
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top

from benchmarks.common import add_official_flags, beside_official, brief_mark, cut, parse_args, publish, machine, matmul_peak, steps_per_second_for, time_call, xla_flops, writes_results  # pylint: disable=g-import-not-at-top
from jaxlab.core import host  # pylint: disable=g-import-not-at-top
from jaxlab.methods.flow_mi import estimators  # pylint: disable=g-import-not-at-top
from jaxlab.methods.flow_mi import fitting  # pylint: disable=g-import-not-at-top
from jaxlab.methods.flow_mi import tasks  # pylint: disable=g-import-not-at-top

WORKER = pathlib.Path(__file__).resolve().parent / "flow_mi_official_worker.py"
CHUNK = 250
TASK = "dense-5x5"
NUM_SAMPLES = 10_000
OFFICIAL_PER_1000 = {"jvf": 34.0, "nvf": 36.0}
OFFICIAL_ESTIMATE = {"jvf": 36.0, "nvf": 49.0}
OPTIONS = estimators.Options(num_bins=128, flow_hidden=8, flow_depth=2, flow_layers=1,
                             batch_size=256, eval_every=250)


def reference_data() -> fitting.FitData:
  x, y = tasks.get_task(TASK).sample(jax.random.key(0), NUM_SAMPLES)
  split = estimators.split(x, y, jax.random.key(1), 0.5, True)
  return jax.tree.map(lambda a: a[None], split)


def chunk_setup(method: str):
  """(trainable, the compiled-on-first-call chunk function, keys, initial state) of one seed."""
  trainable = estimators.trainable(method, 5, 5, OPTIONS)
  schedule = OPTIONS.schedule()
  chunk = fitting.chunk_function(trainable, schedule)
  keys = jax.random.split(jax.random.key(0), 1)
  state = jax.block_until_ready(fitting._init_function(trainable, schedule)(keys))  # pylint: disable=protected-access
  return trainable, chunk, keys, state


def bench_training(method: str, data: fitting.FitData, chunks: int = 4) -> dict[str, float]:
  """Seconds per 1,000 steps (timed over `chunks` 250-step chunks), compile seconds, GFLOP/s."""
  trainable, chunk, keys, state = chunk_setup(method)
  args = (state, data, keys, jnp.asarray(0), jnp.asarray(250))
  start = time.perf_counter()
  chunk.lower(*args).compile()
  compile_s = time.perf_counter() - start
  flops = 1000 * step_flops(trainable, data) + 4 * eval_flops(trainable, data)
  state, metrics = chunk(*args)
  jax.block_until_ready(metrics)
  start = time.perf_counter()
  for begin in range(250, 250 * (chunks + 1), 250):
    state, metrics = chunk(state, data, keys, jnp.asarray(begin), jnp.asarray(begin + 250))
  jax.block_until_ready(metrics)
  seconds = (time.perf_counter() - start) * 4 / chunks
  return {"per_1000": seconds, "compile": compile_s, "gflops": flops / seconds / 1e9}


def step_flops(trainable: fitting.Trainable, data: fitting.FitData) -> float:
  """FLOPs of one training step as XLA counts them (its cost analysis counts a scan body once,
  so the chunk's own count would miss the 250 iterations)."""
  params = trainable.model.init(jax.random.key(0))
  opt_state = trainable.optimizer.init(params)
  x, y = data.x_train[0, :256], data.y_train[0, :256]

  def step(params, opt_state, extra):
    grads, _ = jax.grad(trainable.train_loss, has_aux=True)(params, extra, x, y,
                                                            jax.random.key(1))
    return trainable.optimizer.update(grads, opt_state, params)
  return xla_flops(step, params, opt_state, trainable.init_extra())


def eval_flops(trainable: fitting.Trainable, data: fitting.FitData) -> float:
  params = trainable.model.init(jax.random.key(0))
  return xla_flops(trainable.test_metrics, params, data.x_test[0], data.y_test[0])


def chunk_runner(method: str, data: fitting.FitData):
  """A call that runs our next 250-step chunk (training and its held-out evaluation), compiled."""
  _, chunk, keys, state = chunk_setup(method)
  begin = 0

  def call():
    nonlocal state, begin
    state, metrics = chunk(state, data, keys, jnp.asarray(begin), jnp.asarray(begin + CHUNK))
    begin += CHUNK
    return metrics
  jax.block_until_ready(call())   # compiles
  return call


def side_by_side_lines(args, data: fitting.FitData) -> list[str]:
  rows, info = [], {}
  for method in ("jvf", "nvf"):
    def make_ours(method=method):
      ours = chunk_runner(method, data)
      return lambda seconds: CHUNK * steps_per_second_for(ours, seconds)
    result, info = beside_official(args, WORKER, [f"--method={method}"], make_ours)
    rows.append(result.seconds_row(method, 1000))
  return [f"\n## flow_mi beside the official code, {machine()}, official in jax "
          f"{info.get('jax')}{brief_mark(args)}\n\n",
          f"{TASK}, N = {NUM_SAMPLES}, batch 256, one MAF RQ-spline layer (width 8, depth 2, 128 "
          f"bins), a held-out evaluation every 250 steps. Official: `{args.official}`, its "
          "`JointVariationalEstimator` / `NeuralVariationalEstimator` training loop as its own "
          "`Run Time` measures it (`benchmarks/flow_mi_official_worker.py`); "
          f"{args.rounds} rounds of {args.window:g} s windows, ours then official.\n\n",
          "| estimator | jaxlab s / 1,000 steps | official s / 1,000 steps | speed-up (median of "
          "rounds) | load before windows |\n|---|---|---|---|---|\n", *rows]


def bench_estimate(method: str, steps: int) -> tuple[float, float]:
  """(seconds for one cold `estimate` call, of which compiling) in a fresh process."""
  code = f"""
import time, jax, numpy as np
from jaxlab.methods.flow_mi import estimators, tasks
x, y = jax.device_get(tasks.get_task({TASK!r}).sample(jax.random.key(0), {NUM_SAMPLES}))
x, y = np.asarray(x), np.asarray(y)
jax.block_until_ready(jax.numpy.zeros(1))
start = time.perf_counter()
estimators.estimate(x, y, {method!r}, steps={steps}, num_bins=128)
total = time.perf_counter() - start
start = time.perf_counter()
estimators.estimate(x, y, {method!r}, steps={steps}, num_bins=128)
print(total, total - (time.perf_counter() - start))
"""
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                       cwd=pathlib.Path(__file__).resolve().parents[1])
  total, compile_s = map(float, out.stdout.split()[-2:])
  return total, compile_s


def profile_jvf_step(data: fitting.FitData, repeats: int = 50) -> list[tuple[str, float]]:
  """Milliseconds of the parts of one JVF training step (each jitted on its own)."""
  trainable = estimators.trainable("jvf", 5, 5, OPTIONS)
  params = trainable.model.init(jax.random.key(0))
  opt_state = trainable.optimizer.init(params)
  x_train, y_train = data.x_train[0], data.y_train[0]
  n = x_train.shape[0]
  key = jax.random.key(3)

  def draw(key):
    rows = jax.lax.top_k(jax.random.uniform(key, (n,)), 256)[1]
    return x_train[rows], y_train[rows]

  x, y = jax.jit(draw)(key)
  loss = jax.jit(lambda p, x, y, k: trainable.train_loss(p, {}, x, y, k)[0])
  grad = jax.jit(jax.grad(lambda p, x, y, k: trainable.train_loss(p, {}, x, y, k)[0]))
  grads = grad(params, x, y, key)
  update = jax.jit(lambda g, s, p: trainable.optimizer.update(g, s, p))
  flows_only = jax.jit(lambda p, x, y: trainable.model.module(p)(x, y))
  return [
      ("minibatch draw (top-k of uniform keys)", 1e3 * time_call(jax.jit(draw), key,
                                                                 repeats=repeats)),
      ("flows forward (f and g)", 1e3 * time_call(flows_only, params, x, y, repeats=repeats)),
      ("loss forward (flows + Gaussian entropy)", 1e3 * time_call(loss, params, x, y, key,
                                                                  repeats=repeats)),
      ("loss + gradient", 1e3 * time_call(grad, params, x, y, key, repeats=repeats)),
      ("AdamW update", 1e3 * time_call(update, grads, opt_state, params, repeats=repeats)),
  ]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--estimate-steps", type=int, default=500)
  parser.add_argument("--no-append", action="store_true")
  add_official_flags(parser)
  args = parse_args(parser, estimate_steps=250)
  host.tune_allocator()
  if args.official is not None:
    publish(side_by_side_lines(args, reference_data()), "flow_mi official",
            write=writes_results(args))
    return
  peak = matmul_peak(jnp.float32, repeats=cut(args, 10))
  data = reference_data()
  rows = []
  for method in estimators.TRAINED_METHODS:
    result = bench_training(method, data, chunks=cut(args, 4, to=1))
    official = OFFICIAL_PER_1000.get(method)
    speedup = f"{official / result['per_1000']:.1f}x" if official else "—"
    rows.append(f"| {method} | {result['per_1000']:.1f} | {official or '—'} | {speedup} | "
                f"{result['compile']:.1f} | {result['gflops']:.2f} | "
                f"{100 * result['gflops'] / peak:.2f}% |\n")
  estimate_rows = []
  for method in ("jvf", "nvf"):
    total, compile_s = bench_estimate(method, args.estimate_steps)
    estimate_rows.append(f"| {method} | {args.estimate_steps} | {total:.1f} | {compile_s:.1f} | "
                         f"{OFFICIAL_ESTIMATE[method]:.0f} |\n")
  profile = profile_jvf_step(data, repeats=cut(args, 50, to=5))
  text = (f"\n## flow_mi estimators, {machine()}{brief_mark(args)}\n\n"
          f"{TASK}, N = {NUM_SAMPLES}, batch 256, one MAF RQ-spline layer (width 8, depth 2, "
          f"128 bins), float32. Matmul peak (jitted 2048x2048 jnp.dot): {peak:.0f} GFLOP/s.\n\n"
          "| estimator | s / 1000 steps | official s / 1000 | speed-up | compile s | GFLOP/s | "
          "% of matmul peak |\n|---|---|---|---|---|---|---|\n" + "".join(rows) +
          "\nOne `estimate()` call end to end (fresh process; compile = first call minus a "
          "second, warm call):\n\n| estimator | steps | total s | of which compile s | "
          "official total s |\n|---|---|---|---|---|\n" + "".join(estimate_rows) +
          "\nWhere one JVF training step goes (each part jitted alone, batch 256):\n\n"
          "| part | ms |\n|---|---|\n" +
          "".join(f"| {name} | {ms:.2f} |\n" for name, ms in profile))
  publish([text], "flow_mi", write=writes_results(args))


if __name__ == "__main__":
  main()
