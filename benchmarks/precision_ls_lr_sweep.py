"""precision_ls: where BaseConv leaves its loss plateau, for one LR, fast.

Trains one gradient-task arm of the quick preset (3 vmapped seeds) in jitted `lax.scan` chunks of
250 steps on fresh problems, without the data pipeline or checkpoints, and prints / writes the
training MSE per seed every chunk and the final one-step gradient MSE on the test problems. Used to
pick the quick preset's LRs (README, "Learning rate"); a warm-started arm (`continue_*`) starts
from the perturbed hand-set BaseConv, as in the preset.

  python benchmarks/precision_ls_lr_sweep.py --arm=recipe --lr=3e-3 --steps=10000 \
      --out=results/ablations/precision_ls_lr_sweep_3e-3.json
"""
from __future__ import annotations

import argparse
import json
import pathlib
import time

import jax
import jax.numpy as jnp

from jaxlab.core import config as config_lib
from jaxlab.core import host
from jaxlab.methods.precision_ls import reproduction
from jaxlab.methods.precision_ls import training

CONFIG = pathlib.Path(__file__).resolve().parents[1] / "configs" / "precision_ls.py"


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--arm", default="recipe")
  parser.add_argument("--lr", type=float, default=3e-3)
  parser.add_argument("--steps", type=int, default=10_000)
  parser.add_argument("--stats_batches", type=int, default=8)
  parser.add_argument("--chunk", type=int, default=250)
  parser.add_argument("--out", default="")
  args = parser.parse_args()
  host.tune_allocator()
  jax.config.update("jax_enable_x64", True)
  quick = config_lib.load_config(CONFIG, "quick")
  config = reproduction.variant_config(quick, args.arm)
  config = config_lib.with_overrides(config, {"optim": {"lr": args.lr,
                                                        "stats_batches": args.stats_batches}})
  source = reproduction.warm_start_source(quick, args.arm)
  if source not in ("", reproduction.HANDSET_SOURCE):
    parser.error(f"--arm={args.arm} starts from another variant ({source}); sweep that one")
  initial = reproduction.initial_params(config, source, {})
  experiment = training.make_experiment(config, initial)
  batch_size, seeds = config.train.batch_size, config.train.num_seeds

  def chunk(state, start):
    def body(state, step):
      examples = {"example": step * batch_size + jnp.arange(batch_size)}
      return experiment.update(state, examples, jax.random.fold_in(jax.random.key(0), step))
    state, metrics = jax.lax.scan(body, state, start + jnp.arange(args.chunk))
    return state, jax.tree.map(lambda m: m[-1], metrics)

  chunk = jax.jit(chunk, donate_argnums=0)
  state = experiment.init(jax.random.key(config.seed))
  records, start_time = [], time.perf_counter()
  for start in range(0, args.steps, args.chunk):
    state, metrics = chunk(state, jnp.asarray(start))
    metrics = jax.device_get(metrics)
    records.append({"step": start + args.chunk,
                    "seconds": round(time.perf_counter() - start_time, 1),
                    "loss": [float(metrics[f"loss_seed{r}"]) for r in range(seeds)],
                    "lr": [float(metrics[f"lr_seed{r}"]) for r in range(seeds)]})
    print(records[-1], flush=True)
  final = reproduction.grad_mse_per_seed(config, state["params"])
  print({"final_grad_mse": final})
  if args.out:
    payload = {"arm": args.arm, "lr": args.lr, "stats_batches": args.stats_batches,
               "records": records, "final_grad_mse": final}
    if initial is not None:
      payload["start_grad_mse"] = reproduction.grad_mse_per_seed(config, initial)
    pathlib.Path(args.out).write_text(json.dumps(payload, indent=1) + "\n")


if __name__ == "__main__":
  main()
