"""btbs_lns reproduction: learned LNS with binarized tightening and branch and search, against
SCIP, HiGHS and random LNS, with the claims.

  python -m experiments.btbs_lns --config=configs/btbs_lns.py:quick

Per family: local-branching labels on the training instances, two destroy networks trained by
imitation (on bits, on whole variables), optionally REINFORCE on them (`reinforce.iterations`),
a branch head trained on each (on that network's own neighbourhoods), then every method on every test instance and
solver seed (`data.run_seeds`) under the same wall clock. Stages are cached under
`<workdir>/stages/<config hash>/` (`labels/`, `policies/`, `runs/`), so a rerun of the same config
resumes after the last finished stage and a changed one starts afresh. Writes
`<workdir>/results.json` (quick: also `results/btbs_lns.json`, the btbs policies in
`results/btbs_lns_policies/` and a figure of the primal gap over time).
"""
from __future__ import annotations

import dataclasses
import json
import os
import pickle
import time

import jax
import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import lns
from jaxlab.methods.btbs_lns import neighbourhood
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import reinforce
from jaxlab.methods.btbs_lns import scoring
from jaxlab.methods.btbs_lns import solvers
from jaxlab.methods.btbs_lns import training

SLUG = "btbs_lns"
PAPER_HEADLINE = ("beats SCIP and Random/RL/CL-LNS and local branching; 10% better primal gap "
                  "than Gurobi 9.5 on MIPLIB2017 at 300 s")
PUBLISHED_POLICY_KEYS = ("destroy_bt", "branch")


@dataclasses.dataclass(frozen=True)
class Settings:
  families: tuple[str, ...]
  methods: tuple[str, ...]
  sizes: dict
  lns: lns.LnsSpec
  labels: training.LabelSpec
  policy: policy_lib.PolicySpec
  fit: training.FitSpec
  reinforce: reinforce.ReinforceSpec
  time_limit: float | None
  reference_time_limit: float
  train_seeds: tuple[int, ...]
  test_seeds: tuple[int, ...]
  run_seeds: int


def settings(config: ml_collections.ConfigDict) -> Settings:
  """Every value checked; a bad one raises ConfigError naming its key."""
  families = config_lib.select_names(config, "families", instances.FAMILIES)
  methods = config_lib.select_names(config, "methods", lns.METHODS)
  learned = [m for m in methods if m in lns.LEARNED]
  config_lib.require(config.data.train_instances >= 1 or not learned, "data.train_instances",
                     "the learned methods need >= 1 training instance")
  config_lib.require(config.data.test_instances >= 2, "data.test_instances",
                     "the claims pair methods over test instances: need >= 2")
  config_lib.require(config.data.run_seeds >= 1, "data.run_seeds",
                     "each method needs >= 1 run (solver seed) per test instance")
  config_lib.require(config.data.train_seed + config.data.train_instances
                     <= config.data.test_seed, "data.test_seed",
                     "test instances must come from seeds after every training seed")
  time_limit = float(config.time_limit) or None
  try:
    lns_spec = lns.LnsSpec(
        destroy_rate=config.lns.destroy_rate, sub_time_limit=config.lns.sub_time_limit,
        branch_share=config.lns.branch_share, start=config.lns.start,
        start_share=config.lns.start_share, sub_node_limit=config.lns.sub_node_limit or None,
        max_steps=config.lns.max_steps or None)
    lns.check_budget(time_limit, lns_spec)
    label_spec = training.LabelSpec(
        steps=config.labels.steps, kappa_rate=config.labels.kappa_rate,
        time_limit=None if config.labels.node_limit else config.labels.time_limit,
        node_limit=config.labels.node_limit or None,
        start=config.labels.start or config.lns.start,
        start_time_limit=config.lns.start_share * (time_limit or 10.0))
    policy_spec = policy_lib.PolicySpec(**config.policy)
    fit_spec = training.FitSpec(steps=config.train.steps, batch_size=config.train.batch_size,
                                learning_rate=config.train.learning_rate)
    reinforce_spec = reinforce.ReinforceSpec(
        iterations=config.reinforce.iterations, episode_steps=config.reinforce.episode_steps,
        learning_rate=config.reinforce.learning_rate,
        sub_time_limit=None if lns_spec.sub_node_limit else lns_spec.sub_time_limit,
        sub_node_limit=lns_spec.sub_node_limit)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  sizes = {family: dict(config.sizes[family]) for family in families}
  for family in families:
    try:
      instances.generate(family, 0, **sizes[family]) if config.preset == "smoke" else None
    except (TypeError, ValueError) as e:
      raise config_lib.ConfigError(f"config key 'sizes.{family}': {e}") from None
  train = config.data.train_seed
  test = config.data.test_seed
  return Settings(families=tuple(families), methods=tuple(methods), sizes=sizes, lns=lns_spec,
                  labels=label_spec, policy=policy_spec, fit=fit_spec,
                  reinforce=reinforce_spec, time_limit=time_limit,
                  reference_time_limit=float(config.reference_time_limit),
                  train_seeds=tuple(range(train, train + config.data.train_instances)),
                  test_seeds=tuple(range(test, test + config.data.test_instances)),
                  run_seeds=int(config.data.run_seeds))


# ---------------------------------------------------------------------------------------------
# Training.


def neighbourhoods_of(trained: lns.Trained, key: str, samples, bucket, spec: lns.LnsSpec,
                      seed: int, whole: bool):
  """The destroy network `key`'s sampled neighbourhood at every labelled state."""
  rng = np.random.default_rng(seed)
  network = policy_lib.bind(trained.policy, trained.params[key])
  return [lns.sample_release(network, sample.static, sample.x, bucket,
                             neighbourhood.budget_of(sample.static.num_bits, spec.destroy_rate),
                             rng, whole=whole)[0]
          for sample in samples]


# (branch parameters, the destroy network they are trained on, whether it acts on whole
# variables) of the learned arms that branch, from `lns.ARMS`.
BRANCH_HEADS = tuple(sorted({(branch, destroy, whole)
                             for destroy, whole, branch in lns.ARMS.values() if branch}))


def train_family(family: str, s: Settings, stages: str, seed: int, progress: bool
                 ) -> tuple[lns.Trained, dict]:
  """Labels, the destroy networks (bits, whole variables), REINFORCE on them if configured, and
  a branch head on each (trained on that network's neighbourhoods, its trunk frozen). Cached:
  `labels/<family>.pkl`, `policies/<family>.npz`, `policies/<family>.json`."""
  policy_path = os.path.join(stages, "policies", f"{family}.npz")
  info_path = os.path.join(stages, "policies", f"{family}.json")
  if os.path.exists(policy_path) and os.path.exists(info_path):
    with open(info_path, encoding="utf-8") as f:
      return lns.load_trained(policy_path), json.load(f)
  tic = time.perf_counter()
  label_path = os.path.join(stages, "labels", f"{family}.pkl")
  if os.path.exists(label_path):
    with open(label_path, "rb") as f:
      samples = pickle.load(f)
  else:
    samples = []
    for index, instance_seed in enumerate(s.train_seeds):
      mip = instances.generate(family, instance_seed, **s.sizes[family])
      samples += training.collect(mip, s.labels, s.policy.max_bits, seed=seed + index)
    with metrics_lib.atomic_file(label_path, "wb") as f:
      pickle.dump(samples, f)
  label_s = time.perf_counter() - tic
  if not samples:
    raise RuntimeError(f"{family}: no local-branching step improved any training incumbent; "
                       "raise labels.kappa_rate or labels.time_limit")
  tic = time.perf_counter()
  bucket = training.bucket_of_samples(samples)
  policy = policy_lib.Policy.create(s.policy, seed)[0]
  params, losses = {}, {}
  for key, whole, init_seed, desc in (("destroy_bt", False, seed + 1, "destroy (bits)"),
                                      ("destroy_whole", True, seed + 3, "destroy (whole)")):
    params[key], losses[key] = training.fit(
        policy, policy.init(init_seed), training.destroy_dataset(samples, bucket, whole=whole),
        "destroy", s.fit, seed=seed, progress=progress, desc=f"{family} {desc}")
  trained = lns.Trained(policy, params)
  info = {}
  if s.reinforce.iterations:
    info["reinforce"] = fine_tune_destroy(family, s, trained, bucket, seed, progress)
  for key, destroy_key, whole in BRANCH_HEADS:
    chosen = neighbourhoods_of(trained, destroy_key, samples, bucket, s.lns, seed, whole)
    params[key], losses[key] = training.fit(
        policy, params[destroy_key], training.branch_dataset(samples, bucket, chosen), "branch",
        s.fit, seed=seed, progress=progress, desc=f"{family} {key}")
  changed = [int(np.sum(x.target_bit < x.static.num_bits)) for x in samples]
  info.update({"labelled_states": len(samples), "changed_per_state": float(np.mean(changed)),
               "label_s": label_s,
               "fit_s": time.perf_counter() - tic - info.get("reinforce", {}).get("s", 0.0),
               "loss_first": {k: v[0] for k, v in losses.items()},
               "loss_last": {k: v[-1] for k, v in losses.items()}, "bucket": list(bucket)})
  lns.save_trained(trained, policy_path)
  metrics_lib.write_json(info_path, info)     # last: its presence marks the stage finished
  return trained, info


def fine_tune_destroy(family: str, s: Settings, trained: lns.Trained, bucket, seed: int,
                      progress: bool) -> dict:
  """REINFORCE on both destroy networks (so the ablation without binarized tightening changes
  one thing only), in place; the mean episode reward of the first and last tenth."""
  tic = time.perf_counter()
  mips = [instances.generate(family, t, **s.sizes[family]) for t in s.train_seeds]
  statics = [features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), s.policy.max_bits)
             for mip in mips]
  info = {}
  for key, whole in (("destroy_bt", False), ("destroy_whole", True)):
    trained.params[key], rewards = reinforce.fine_tune(
        mips, statics, trained.policy, trained.params[key], bucket, s.reinforce,
        destroy_rate=s.lns.destroy_rate, whole=whole, start=s.labels.start,
        start_time_limit=s.labels.start_time_limit, seed=seed, progress=progress,
        desc=f"{family} reinforce ({key})")
    tenth = max(1, len(rewards) // 10)
    info[key] = {"reward_first": float(np.mean(rewards[:tenth])),
                 "reward_last": float(np.mean(rewards[-tenth:]))}
  info["s"] = time.perf_counter() - tic
  return info


# ---------------------------------------------------------------------------------------------
# Evaluation.


def run_cached(path: str, mip: instances.MIP, run_fn) -> dict:
  """`run_fn(timing)`'s record, or the one a finished earlier invocation left at `path`."""
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  timing = lns.Timing()
  tic = time.perf_counter()
  run = run_fn(timing)
  record = {"objective": run.objective, "trace": run.trace, "steps": run.steps,
            "wall_s": time.perf_counter() - tic, "dual_gap": run.dual_gap,
            "setup_s": timing.setup_s, "policy_s": timing.policy_s,
            "solver_s": timing.solver_s, "feasible": None}
  if run.x is not None:
    record["feasible"] = bool(mip.is_feasible(run.x, tol=1e-5))
  os.makedirs(os.path.dirname(path), exist_ok=True)
  metrics_lib.write_json(path, metrics_lib.to_python(record))
  return record


def run_key(instance_seed: int, run: int) -> str:
  """A test run's name: its instance, and its solver seed when there are several."""
  return str(instance_seed) if run == 0 else f"{instance_seed}-seed{run}"


def solver_seed(seed: int, instance_seed: int, run: int) -> int:
  """The seed every method gets in run `run` of an instance."""
  return seed + instance_seed + 1000 * run


def run_keys(s: Settings) -> list[tuple[int, str]]:
  """(instance seed, run key) of every test run, instance-major."""
  return [(t, run_key(t, r)) for t in s.test_seeds for r in range(s.run_seeds)]


def evaluate_family(family: str, s: Settings, trained: lns.Trained | None, stages: str,
                    seed: int, progress: bool) -> dict:
  """{run key: {method: record}} for every test instance and solver seed (cached per run).

  Run r of an instance gives every method the same solver seed, so the methods are paired on
  (instance, seed): the LNS methods share their starting solution."""
  out = {}
  jobs = [(t, r, m) for t in s.test_seeds for r in range(s.run_seeds) for m in s.methods]
  mips = {}
  for instance_seed, run, method in metrics_lib.progress_iter(jobs, f"{family} runs",
                                                              enabled=progress):
    if instance_seed not in mips:
      mips[instance_seed] = instances.generate(family, instance_seed, **s.sizes[family])
    mip = mips[instance_seed]
    key = run_key(instance_seed, run)
    path = os.path.join(stages, "runs", family, f"{key}-{method}.json")
    out.setdefault(key, {})[method] = run_cached(
        path, mip, lambda timing, m=method, mip=mip, r=run: lns.run(
            mip, m, time_limit=s.time_limit, spec=s.lns, trained=trained,
            seed=solver_seed(seed, instance_seed, r), timing=timing))
  if s.reference_time_limit > 0:
    for instance_seed, mip in mips.items():
      path = os.path.join(stages, "runs", family, f"{instance_seed}-reference.json")
      out[str(instance_seed)]["reference"] = run_cached(
          path, mip, lambda timing, mip=mip: solvers.solve_scip(
              mip, time_limit=s.reference_time_limit, seed=seed))
  return out


def warm_up(trained: lns.Trained, family: str, s: Settings) -> None:
  """Compiles the policy for the test instances' bucket before any clock starts."""
  mip = instances.generate(family, s.test_seeds[0], **s.sizes[family])
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), s.policy.max_bits)
  graph = features.pad(features.graph_at(static, mip.col_lower.clip(0)))
  jax.block_until_ready(policy_lib.jitted_logits(trained.policy,
                                                 trained.params["destroy_bt"], graph))


def summarise_family(runs: dict, s: Settings) -> dict:
  """metrics.<family>.<method>.{primal_gap, primal_integral, lns_steps} (mean, per_instance:
  mean over the instance's seeds, per_run: instance-major) and scip_dual_gap. z* of an instance
  is the best objective any method found on it in any run."""
  out = {}
  keys = run_keys(s)
  best = {}
  for instance_seed, key in keys:
    found = [r["objective"] for r in runs[key].values() if r["objective"] is not None]
    if found:
      best[instance_seed] = min(found + [best.get(instance_seed, np.inf)])
  horizon = {key: s.time_limit or max([t for r in runs[key].values() for t, _ in r["trace"]]
                                      + [1e-3]) for _, key in keys}
  per_instance = lambda values: [float(np.mean(values[i * s.run_seeds:(i + 1) * s.run_seeds]))
                                 for i in range(len(s.test_seeds))]
  for method in s.methods:
    gaps, integrals, steps, feasible, shares = [], [], [], [], []
    for instance_seed, key in keys:
      record = runs[key][method]
      z_star = best.get(instance_seed)
      gaps.append(scoring.primal_gap(record["objective"], z_star))
      integrals.append(scoring.primal_integral([tuple(p) for p in record["trace"]], z_star,
                                               horizon[key]))
      steps.append(record["steps"])
      feasible.append(record["feasible"])
      shares.append(record["policy_s"] / max(record["policy_s"] + record["solver_s"], 1e-9))
    out[method] = {
        "primal_gap": {"mean": float(np.mean(gaps)), "per_instance": per_instance(gaps),
                       "per_run": gaps},
        "primal_integral": {"mean": float(np.mean(integrals)),
                            "per_instance": per_instance(integrals), "per_run": integrals},
        "lns_steps": {"mean": float(np.mean(steps)), "per_instance": per_instance(steps)},
        "objective": [runs[key][method]["objective"] for _, key in keys],
        "all_feasible": all(f is not False for f in feasible),
        "policy_share": float(np.mean(shares))}
  if "scip" in s.methods:
    dual = [runs[key]["scip"]["dual_gap"] for _, key in keys]
    out["scip_dual_gap"] = {"mean": float(np.mean(dual)), "per_instance": per_instance(dual)}
  out["best_objective"] = [best.get(t) for t in s.test_seeds]
  return out


# ---------------------------------------------------------------------------------------------
# Claims.


def _gaps(metrics: dict, family: str, method: str) -> list[float]:
  """Per test run (instance x solver seed): the unit the claims pair methods on."""
  return metrics[family][method]["primal_gap"]["per_run"]


def _pooled(metrics: dict, families, ours: str, baseline: str) -> dict:
  pairs = [(a, b) for f in families for a, b in zip(_gaps(metrics, f, ours),
                                                    _gaps(metrics, f, baseline))]
  return results.paired_comparison([a for a, _ in pairs], [b for _, b in pairs],
                                   lower_is_better=True)


def claims_of(metrics: dict, s: Settings) -> list[dict]:
  claims = []
  have = set(s.methods)
  families = s.families
  mean_gap = lambda f, m: metrics[f][m]["primal_gap"]["mean"]
  for baseline in ("scip", "random_lns"):
    if not {"btbs", baseline} <= have:
      continue
    per_family = {f: mean_gap(f, "btbs") < mean_gap(f, baseline) for f in families}
    pooled = _pooled(metrics, families, "btbs", baseline)
    claims.append(results.claim(
        f"btbs_beats_{baseline}",
        f"btbs has a lower mean primal gap than {baseline} on every family (decided by the "
        "per-family means and, pooled over all test instances, a paired difference > 2 SE).",
        ours={f: mean_gap(f, "btbs") for f in families},
        baselines={f: mean_gap(f, baseline) for f in families},
        holds=all(per_family.values()) and pooled["better"], paired=pooled,
        paper="BTBS-LNS beats SCIP and Random-LNS on every synthetic family",
        comparison=f"mean gap(btbs) < mean gap({baseline}) per family, and pooled paired "
                   "difference < 0 by 2 SE"))
  if {"btbs", "btbs_no_bt"} <= have and "intcover" in families:
    paired = results.paired_comparison(_gaps(metrics, "intcover", "btbs"),
                                       _gaps(metrics, "intcover", "btbs_no_bt"),
                                       lower_is_better=True)
    claims.append(results.claim(
        "bt_helps_on_general_integers",
        "On the general-integer family (intcover) binarized tightening lowers the primal gap "
        "against the same learned LNS acting on whole variables.",
        ours=mean_gap("intcover", "btbs"),
        baselines={"btbs_no_bt": mean_gap("intcover", "btbs_no_bt")},
        holds=paired["better"], paired=paired,
        paper="BT matters for general integer variables (ablation)",
        comparison="gap(btbs) - gap(btbs_no_bt) < 0 by 2 SE over intcover test instances"))
  if {"btbs", "btbs_no_branch"} <= have:
    wins = {f: mean_gap(f, "btbs") < mean_gap(f, "btbs_no_branch") for f in families}
    needed = min(3, len(families))
    pooled = _pooled(metrics, families, "btbs", "btbs_no_branch")
    claims.append(results.claim(
        "branching_helps",
        f"Branch and search lowers the mean primal gap on at least {needed} of "
        f"{len(families)} families (and pooled over instances by 2 SE).",
        ours={f: mean_gap(f, "btbs") for f in families},
        baselines={f: mean_gap(f, "btbs_no_branch") for f in families},
        holds=sum(wins.values()) >= needed and pooled["better"], paired=pooled,
        paper="the branching network helps escape local optima (ablation)",
        comparison=f">= {needed} family wins and pooled paired difference < 0 by 2 SE"))
  infeasible = [f"{f}.{m}" for f in families for m in s.methods
                if not metrics[f][m]["all_feasible"]]
  claims.append(results.claim(
      "solutions_feasible",
      "Sanity: every returned solution passes an independent NumPy feasibility check.",
      ours={"infeasible_runs": infeasible}, holds=not infeasible, paper=None,
      comparison="no run returns an infeasible point"))
  return claims


def plot(runs_by_family: dict, metrics: dict, s: Settings):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  columns = len(s.families)
  figure, axes = plt.subplots(1, columns, figsize=(3.6 * columns, 3.4), squeeze=False)
  for axis, family in zip(axes[0], s.families):
    runs = runs_by_family[family]
    horizon = s.time_limit or max(t for by in runs.values() for r in by.values()
                                  for t, _ in r["trace"]) or 1.0
    grid = np.linspace(0, horizon, 200)
    for method in s.methods:
      curves = []
      for instance_seed, key in run_keys(s):
        best = metrics[family]["best_objective"][s.test_seeds.index(instance_seed)]
        trace = sorted(tuple(p) for p in runs[key][method]["trace"])
        curve = np.ones_like(grid)
        for time_point, objective in trace:
          curve[grid >= time_point] = scoring.primal_gap(objective, best)
        curves.append(curve)
      axis.plot(grid, np.mean(curves, axis=0), label=method,
                lw=2.2 if method == "btbs" else 1.2)
    axis.set_yscale("symlog", linthresh=1e-3)
    axis.set_title(family)
    axis.set_xlabel("seconds")
  axes[0][0].set_ylabel("primal gap (mean over test runs)")
  axes[0][-1].legend(fontsize=7)
  figure.tight_layout()
  return figure


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  s = settings(config)
  progress = config.train.progress
  stages = config_lib.stage_dir(config, workdir)
  learned = any(m in lns.LEARNED for m in s.methods)
  metrics: dict = {"training": {}}
  runs_by_family = {}
  for family in s.families:
    trained = None
    if learned:
      trained, info = train_family(family, s, stages, config.seed, progress)
      metrics["training"][family] = info
      warm_up(trained, family, s)
    runs_by_family[family] = evaluate_family(family, s, trained, stages, config.seed,
                                             progress)
    metrics[family] = summarise_family(runs_by_family[family], s)
  metrics["settings"] = {"time_limit": s.time_limit, "sizes": s.sizes,
                         "train_instances": len(s.train_seeds),
                         "test_instances": len(s.test_seeds), "run_seeds": s.run_seeds,
                         "label_start": s.labels.start,
                         "lns": dataclasses.asdict(s.lns)}
  claims = claims_of(metrics, s)
  results.save_figure(plot(runs_by_family, metrics, s), workdir, "primal_gap.png", SLUG, config)
  # The quick preset's policies are the public ones (`solve(policy=...)`): the long preset's, trained
  # on larger instances, stay in its workdir.
  if learned and config.preset == "quick" and not results._publish_blocked_by:  # pylint: disable=protected-access
    target = os.path.join(results.RESULTS_DIR, "btbs_lns_policies")
    os.makedirs(target, exist_ok=True)
    for family in s.families:
      lns.save_trained(lns.load_trained(os.path.join(stages, "policies", f"{family}.npz")),
                       os.path.join(target, f"{family}.npz"), keys=PUBLISHED_POLICY_KEYS)
  mean = lambda m: float(np.mean([metrics[f][m]["primal_gap"]["mean"] for f in s.families]))
  headline = None
  if {"btbs", "scip", "random_lns"} <= set(s.methods):
    headline = results.headline(
        f"mean primal gap over {len(s.families)} families, btbs vs scip / random_lns "
        f"({mean('scip'):.4f} / {mean('random_lns'):.4f})", ours=mean("btbs"),
        paper=PAPER_HEADLINE)
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics,
                               claims=claims, headline_metric=headline,
                               wall_s=time.perf_counter() - start,
                               seeds=[solver_seed(config.seed, t, r) for t in s.test_seeds
                                      for r in range(s.run_seeds)])


if __name__ == "__main__":
  cli.run(main, single_process=(
      "the methods are compared on wall-clock-limited solver runs, which must all be timed on "
      "one machine"))
