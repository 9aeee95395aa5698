"""ctrl: CTRL's objective against RL updates, next to its optimum -log Z, for a few settings.

  python benchmarks/ctrl_convergence.py --task toy2d --n 50 --steps 3000 \
      --variants default,lr10,full [--out DIR]

Runs CTRL's fine-tuning (`jaxlab.methods.ctrl.finetune`) on one task of the quick preset at one
offline size, for each named variant of its settings, and records the loss, reward and KL of
every chunk. With alpha = 1 and the KL summed, the objective's infimum over all policies is
-mean_y log Z_y, Z_y = E_pre p_hat(y | x0) under the prior's own chain: the script estimates it
from prior samples, so the gap of each curve to it says how far from converged a budget is.
Writes `ctrl_convergence_<task>_n<N>.json` and `.png` into --out (default: benchmarks/).
Not a test: a probe of where the claims' regime starts.
"""
from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import jax  # pylint: disable=g-import-not-at-top
import jax.numpy as jnp  # pylint: disable=g-import-not-at-top
import numpy as np  # pylint: disable=g-import-not-at-top

from configs import ctrl as ctrl_config  # pylint: disable=g-import-not-at-top
from jaxlab.core import config as config_lib  # pylint: disable=g-import-not-at-top
from jaxlab.diffusion import priors  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import baselines  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import digit_tasks  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import finetune  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import study  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import classifiers  # pylint: disable=g-import-not-at-top
from jaxlab.methods.ctrl import tasks  # pylint: disable=g-import-not-at-top

# Named overrides of the `ctrl` settings; "default" is the quick preset's (policy_min_t = 100
# since commit 280a9e5; the committed runs in results/ablations made before it had no such
# setting, i.e. the policy acted everywhere, as "policy_everywhere" does).
VARIANTS = {
    "default": {},
    "policy_everywhere": dict(policy_min_t=0),
    "lr10": dict(lora_lr=1e-2, embedding_lr=1e-1),
    "rank16": dict(lora_rank=16),
    "full": dict(finetune="full"),
    "full_lr1e-3": dict(finetune="full", full_lr=1e-3),
    "no_wd": dict(weight_decay=0.0),
    "official_kl": dict(kl_reduction="mean"),
    "per_step": dict(truncation="per_step"),
    # The policy acts only at t >= 100, the pretrained denoiser below (`policy_min_t`).
    "frozen_below_t100": dict(policy_min_t=100),
}


def problem_for(task: str, n: int, config):
  """(prior, reward log-prob, num_labels)."""
  group = config.toy2d if task == "toy2d" else config.digits
  prior = priors.load_or_train(priors.PriorSpec.from_config(group.prior), group.prior.cache_dir,
                               progress=False)
  key = jax.random.key(config.seed)
  if task == "toy2d":
    ring = dict(prior.spec.dataset_options)
    ring.pop("seed", None)
    x, y = tasks.toy2d_offline(n, seed=config.seed, ring_options=ring)
    reward, _ = classifiers.fit(x, y, 2, hidden=tuple(config.reward.hidden),
                                steps=config.reward.steps, key=jax.random.fold_in(key, 0),
                                validation_fraction=config.reward.validation_fraction)
    return prior, reward.log_prob, 2
  data = digit_tasks.load_data(config)
  rows = tasks.subset(n, len(data.train_x), seed=config.seed)
  reward, _ = classifiers.fit(data.train_x[rows], data.train_y[rows], tasks.NUM_DIGITS,
                              hidden=tuple(config.reward.hidden), steps=config.reward.steps,
                              key=jax.random.fold_in(key, 10),
                              validation_fraction=config.reward.validation_fraction)
  return prior, reward.log_prob, tasks.NUM_DIGITS


def optimum(prior, log_reward, num_labels: int, sample_steps: int, num: int = 20_000
            ) -> dict[str, float]:
  """The optimum p_pre(x) (p_hat(y | x) + 1e-6) / Z_y of the alpha = 1 objective, from `num`
  samples of the prior's chain: its loss -mean_y log Z_y, its reward E_opt log(p_hat + 1e-6) and
  KL (= loss + reward), and the prior's own reward and share of samples with p_hat < 1e-4."""
  x0 = jnp.asarray(study.prior_draws(prior, num, sample_steps, [7])[0])
  log_z, opt_reward, pre_reward, tiny = [], [], [], []
  for y in range(num_labels):
    log_p = log_reward(x0, jnp.full((num,), y, jnp.int32))
    reward = finetune.floored_reward(log_p)
    log_z.append(float(jax.scipy.special.logsumexp(reward) - math.log(num)))
    weights = jax.nn.softmax(reward)
    opt_reward.append(float(jnp.sum(weights * reward)))
    pre_reward.append(float(jnp.mean(reward)))
    tiny.append(float(jnp.mean(log_p < math.log(1e-4))))
  loss = -float(np.mean(log_z))
  reward = float(np.mean(opt_reward))
  return {"loss": loss, "reward": reward, "kl": loss + reward,
          "prior_reward": float(np.mean(pre_reward)), "prior_share_below_1e-4": float(np.mean(tiny))}


def diagnose(run, apply, prior, log_reward, settings, num_labels: int, num: int = 2048
             ) -> dict[str, object]:
  """The first seed's tuned chain: its per-step KL [K] (mean over samples and labels), mean
  p_hat(y | x0) and share of samples with p_hat < 1e-4."""
  labels = jnp.repeat(jnp.arange(num_labels, dtype=jnp.int32), num // num_labels)
  x0, kl = finetune.sample_with_kl(apply, run.params[0], prior.apply, prior.params,
                                   prior.schedule, labels, jax.random.key(99), settings,
                                   prior.spec.sample_shape)
  log_p = log_reward(x0, labels)
  return {"kl_per_step": [float(v) for v in jnp.mean(kl, axis=1)],
          "mean_p": float(jnp.mean(jnp.exp(log_p))),
          "share_below_1e-4": float(jnp.mean(log_p < math.log(1e-4)))}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--task", default="toy2d", choices=("toy2d", "digits_class"))
  parser.add_argument("--n", type=int, default=50)
  parser.add_argument("--steps", type=int, default=3000)
  parser.add_argument("--seeds", type=int, default=3)
  parser.add_argument("--variants", default="default")
  parser.add_argument("--out", default=str(pathlib.Path(__file__).parent))
  parser.add_argument("--tag", default="", help="suffix of the output files' names")
  parser.add_argument("--set", default="", help="config overrides of the quick preset, "
                      "e.g. toy2d.prior.num_steps=200,ctrl.sample_steps=100")
  args = parser.parse_args()
  config = ctrl_config.get_config("quick")
  if args.set:
    overrides = {}
    for item in args.set.split(","):
      key, value = item.split("=", 1)
      overrides[key] = type(config_lib.flatten(config.to_dict())[key])(value)
    config = config_lib.override(config, overrides)
  prior, log_reward, num_labels = problem_for(args.task, args.n, config)
  apply, policy_params = baselines.prior_network(prior, num_labels)
  best = optimum(prior, log_reward, num_labels, config.ctrl.sample_steps)
  print(f"{args.task} n={args.n} ({jax.devices()[0].platform}): optimum "
        + ", ".join(f"{k} {v:.4f}" for k, v in best.items()), flush=True)
  curves = {}
  for name in args.variants.split(","):
    settings = finetune.Settings.from_config(
        config.ctrl, num_labels=num_labels, steps=args.steps, num_seeds=args.seeds,
        ckpt_every=config.ctrl.chunk_steps, **VARIANTS[name])
    start = time.perf_counter()
    run = finetune.finetune(apply, policy_params, prior.apply, prior.params, prior.schedule,
                            log_reward, settings, jax.random.key(1),
                            sample_shape=prior.spec.sample_shape, progress=False, desc=name)
    curves[name] = {"wall_s": time.perf_counter() - start, "settings": VARIANTS[name],
                    "history": [{k: float(v) for k, v in r.items()} for r in run.history],
                    "final_policy": diagnose(run, apply, prior, log_reward, settings,
                                             num_labels)}
    last = run.history[-1]
    print(f"  {name:14s} {curves[name]['wall_s']:7.1f} s  loss {last['train/loss']:.3f} "
          f"reward {last['train/reward']:.3f} kl {last['train/kl']:.3f}", flush=True)
    final = curves[name]["final_policy"]
    print(f"    final policy: mean p_hat {final['mean_p']:.3f}, share p_hat < 1e-4 "
          f"{final['share_below_1e-4']:.3f}, KL per step "
          + " ".join(f"{v:.2f}" for v in final["kl_per_step"]), flush=True)
    for r in run.history[:: max(1, len(run.history) // 12)]:
      print(f"    step {int(r['step']):6d} loss {r['train/loss']:.3f} reward "
            f"{r['train/reward']:.3f} kl {r['train/kl']:.3f}", flush=True)
  out = pathlib.Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  stem = f"ctrl_convergence_{args.task}_n{args.n}{args.tag}"
  (out / f"{stem}.json").write_text(json.dumps(
      {"task": args.task, "n": args.n, "optimum": best, "seeds": args.seeds,
       "device": jax.devices()[0].platform, "overrides": args.set, "curves": curves}, indent=1))
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  fig, axes = plt.subplots(1, 3, figsize=(12, 3.2))
  for name, curve in curves.items():
    steps = [r["step"] for r in curve["history"]]
    for ax, key in zip(axes, ("train/loss", "train/reward", "train/kl")):
      ax.plot(steps, [r[key] for r in curve["history"]], label=name)
  axes[1].axhline(best["reward"], color="k", ls="--", lw=1)
  axes[2].axhline(best["kl"], color="k", ls="--", lw=1)
  axes[0].axhline(best["loss"], color="k", ls="--", lw=1, label="optimum -log Z")
  for ax, title in zip(axes, ("loss", "reward E log p_hat(y|x0)", "KL (nats)")):
    ax.set_title(f"{args.task} N={args.n}: {title}", fontsize=9)
    ax.set_xlabel("RL updates")
  axes[0].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out / f"{stem}.png", dpi=110)


if __name__ == "__main__":
  main()
