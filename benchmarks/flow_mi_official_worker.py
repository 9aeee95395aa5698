"""Times the official FlowMI training loops (calebdahlke/FlowMI, `_flow_estimator.py`).

Started by `flow_mi_speed.py --official DIR --official-python PATH`, PATH being the Python of an
environment with the official code's pins (its `environment.yml`: `pip install jax==0.4.23
jaxlib==0.4.23 flowjax==11.2.0 equinox==0.11.3 jaxtyping==0.2.25 optax==0.1.8 chex==0.1.85
numpy==1.26.3 pydantic==2.5.3 scipy==1.12.0 tqdm matplotlib`); not a jaxlab dependency and never
imported by jaxlab. The entry point is the official estimator the benchmark script uses,
`JointVariationalEstimator` (JVF) or `NeuralVariationalEstimator` (NVF) with `use_flow=True` and
its defaults (one RQ-spline MAF layer of width 8, depth 2, 128 knots on [-8, 8]), batch 256, a
held-out evaluation every 250 steps and a 50% split, on the reference data: 10,000 draws of the
dense 5x5 Gaussian (every correlation 0.5), as `flow_mi_speed.py` uses. The timed quantity is the
estimator's own `Run Time` (the training loop after its warm-up compile, as the official code
measures it) over its `n_training_steps`; each window is one `estimate_with_info` call sized to
run about that long (early stopping may end it sooner: the steps it ran are what is reported).

Changes needed to run it, and nothing else: the official code's prints go to stderr.

Protocol: see `official_protocol.py` (`serve_measured`).
"""
from __future__ import annotations

import argparse
import pathlib
import sys

import official_protocol  # benchmarks/, the script's own directory

NUM_SAMPLES = 10_000
DIM = 5
CHUNK = 250   # the official held-out evaluation period; calls run whole chunks


def reference_data(np):
  covariance = np.full((2 * DIM, 2 * DIM), 0.5) + 0.5 * np.eye(2 * DIM)
  xy = np.random.default_rng(0).multivariate_normal(np.zeros(2 * DIM), covariance, NUM_SAMPLES)
  return xy[:, :DIM], xy[:, DIM:]


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--official", required=True, type=pathlib.Path)
  parser.add_argument("--method", choices=("jvf", "nvf"), default="jvf")
  args = parser.parse_args()
  protocol = official_protocol.take_stdout()   # the official code prints to stdout
  import numpy as np  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, str(args.official))
  import jax  # pylint: disable=g-import-not-at-top
  import _flow_estimator  # pylint: disable=g-import-not-at-top

  estimator_class = {"jvf": _flow_estimator.JointVariationalEstimator,
                     "nvf": _flow_estimator.NeuralVariationalEstimator}[args.method]
  x, y = reference_data(np)

  def run(steps: int) -> tuple[int, float]:
    estimator = estimator_class(dim_x=DIM, dim_y=DIM, use_flow=True, batch_size=256,
                                max_n_steps=steps, test_every_n_steps=CHUNK,
                                train_test_split=0.5)
    info = estimator.estimate_with_info(x, y).additional_information
    return int(info["n_training_steps"]), float(info["Run Time"])

  steps, seconds = run(CHUNK)   # warm-up, and the first rate
  rate = steps / seconds

  def measure(window: float) -> tuple[int, float]:
    nonlocal rate
    chunks = max(1, round(rate * window / CHUNK))
    steps, seconds = run(chunks * CHUNK)
    rate = steps / seconds
    return steps, seconds

  official_protocol.serve_measured(measure, protocol, jax=jax.__version__, method=args.method)


if __name__ == "__main__":
  main()
