"""pico reproduction: peer-review ranking with consistency-optimised reviewer weights.

  python -m experiments.pico --config=configs/pico.py:quick

Simulated peer review (15 models judging each other on 80 questions, calibrated to the real
gpt-3.5-turbo judgments) in two families, every method at every kept fraction over the seeds;
the real one-reviewer file and the 16 official logs scored with the same metrics. The whole run
takes about a minute and keeps no checkpoint. Writes `<workdir>/results.json` (for the quick
preset also `results/pico.json`) and a figure of Spearman S per method and fraction.
"""
from __future__ import annotations

import dataclasses
import time

import jax
import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import results
from jaxlab.methods.pico import battles as battles_lib
from jaxlab.methods.pico import consistency
from jaxlab.methods.pico import data
from jaxlab.methods.pico import metrics as pico_metrics
from jaxlab.methods.pico import ranking
from jaxlab.methods.pico import simulate

SLUG = "pico"
FAMILIES = ("default", "violated")
METRICS = ("spearman", "kendall", "pen", "cin", "lis")
PAPER = "S/tau/H 0.89/0.72/1.01 (MT-Bench, 15 real reviewers)"


def options(config: ml_collections.ConfigDict):
  methods = config_lib.select_names(config, "methods", ranking.METHODS)
  families = config_lib.select_names(config, "families", FAMILIES)
  fractions = tuple(float(f) for f in config.fractions)
  config_lib.require(all(0.0 < f <= 1.0 for f in fractions) and fractions, "fractions",
                     f"each must be in (0, 1], got {fractions}")
  config_lib.require(config.num_seeds >= 2, "num_seeds",
                     f"the claims pair methods over seeds: need >= 2, got {config.num_seeds}")
  config_lib.require(config.fit.num_steps >= 1, "fit.num_steps", "must be >= 1")
  config_lib.require(0 <= config.fit.max_eliminated < 15, "fit.max_eliminated",
                     "must be in 0..14 (15 reviewers)")
  return methods, families, fractions


def padded(battles: battles_lib.Battles, size: int) -> tuple[battles_lib.Battles, np.ndarray]:
  """The battles padded to `size` with masked dummies: one compiled fit for every seed."""
  extra = size - battles.num_battles
  pad = lambda a, v: np.concatenate([a, np.full(extra, v, a.dtype)])
  out = battles_lib.Battles(battles.models, pad(battles.model_a, 0), pad(battles.model_b, 1),
                            pad(battles.reviewer, 0), pad(battles.score_a, 0.5),
                            pad(battles.question, -1))
  return out, np.arange(size) < battles.num_battles


def _summary(values):
  values = [float(v) for v in values]
  return {"mean": float(np.mean(values)), "std": float(np.std(values)), "values": values}


def simulated_study(config, spec_by_family, methods, families, fractions, seeds):
  """metrics.sim.<family>.frac<f>.<method>.<metric> ({mean, std, values} over seeds), plus
  default.weights_vs_ability and default.elimination."""
  fit = config.fit
  settings = dict(num_models=15, num_steps=int(fit.num_steps),
                  learning_rate=float(fit.learning_rate), k_rank=float(fit.k_rank))
  truth = np.arange(15)
  out: dict = {}
  ability_corr, elim = [], {"chosen_k": [], "by_k": []}
  units = [(family, seed) for family in families for seed in seeds]
  for family, seed in metrics_lib.progress_iter(units, "pico seeds", config.train.progress):
    spec = spec_by_family[family]
    battles = simulate.simulate(spec, seed)
    size = int(np.ceil(simulate.expected_battles(spec) * 1.2 / 1000) * 1000)
    size = max(size, battles.num_battles)
    full, real_mask = padded(battles, size)
    arrays = consistency.arrays(full)
    for fraction in fractions:
      keep = consistency.subsample_mask(battles, fraction, seed)
      mask = np.zeros(size, bool)
      mask[:battles.num_battles] = keep
      subset = battles.take(np.flatnonzero(keep))
      row = out.setdefault(family, {}).setdefault(f"frac{fraction}", {})
      for method in methods:
        if method in ("pico", "pico_elo"):
          variant = "rank" if method == "pico" else "elo"
          result = consistency.fit(arrays, jax.random.key(seed), None, mask, variant=variant,
                                   **settings)
          order = np.argsort(-np.asarray(result.scores), kind="stable")
          if method == "pico" and family == "default" and fraction == 1.0:
            # Weights against ability (ability falls with the true rank, the model index).
            ability_corr.append(pico_metrics.spearman(
                np.argsort(-np.asarray(result.weights), kind="stable")))
            eliminated = consistency.eliminate(arrays, jax.random.key(seed), mask,
                                               max_eliminated=int(fit.max_eliminated),
                                               **settings)
            orders = np.asarray(eliminated.order)
            elim["by_k"].append([pico_metrics.spearman(o) for o in orders])
            elim["chosen_k"].append(int(eliminated.chosen_k))
        else:
          order, _, _ = ranking.rank(subset, method, seed=seed, true_order=truth)
        for name, value in pico_metrics.all_metrics(order).items():
          row.setdefault(method, {}).setdefault(name, []).append(float(value))
  for family in out.values():
    for row in family.values():
      for method, values in row.items():
        row[method] = {name: _summary(v) for name, v in values.items()}
  if ability_corr:
    out["default"]["weights_vs_ability"] = _summary(ability_corr)
    by_k = np.asarray(elim["by_k"])
    chosen = np.asarray(elim["chosen_k"])
    out["default"]["elimination"] = {
        **{f"k{k}": {"spearman": _summary(by_k[:, k])} for k in range(by_k.shape[1])},
        "chosen_k": [int(k) for k in chosen],
        "chosen": {"spearman": _summary(by_k[np.arange(len(chosen)), chosen])}}
  return out


def real_study() -> dict:
  records = data.read_jsonl(data.REAL_FILE)
  names = data.true_order()
  order, _, _ = ranking.rank(records, "uniform", true_order=names)
  return {"gpt35_only": {"uniform": pico_metrics.all_metrics(order),
                         "num_battles": len(records)}}


def official_log_study() -> dict:
  out = {}
  for stem, log in data.official_logs().items():
    ours = pico_metrics.all_metrics(log["order"])
    ours["logged_cin"], ours["logged_lis"] = log["cin"], log["lis"]
    out[stem] = ours
  return out


def _paired(sim, family, fraction, ours, base, metric, lower):
  a = sim[family][f"frac{fraction}"][ours][metric]["values"]
  b = sim[family][f"frac{fraction}"][base][metric]["values"]
  return results.paired_comparison(a, b, lower_is_better=lower)


def claims_of(sim, methods, families, fractions):
  claims = []
  if {"pico", "uniform"} <= set(methods) and "default" in families:
    paired, holds = {}, True
    for f in fractions:
      for metric, lower in (("spearman", False), ("kendall", False), ("pen", True),
                            ("cin", True)):
        p = _paired(sim, "default", f, "pico", "uniform", metric, lower)
        paired[f"frac{f}_{metric}"] = p
        holds = holds and p["better"]
    claims.append(results.claim(
        "pico_beats_uniform", "Default family, every fraction: PiCO's S and tau are above "
        "Uniform's and its H and CIN below (seed-paired).",
        ours={f"frac{f}": sim["default"][f"frac{f}"]["pico"]["spearman"]["mean"]
              for f in fractions},
        baselines={f"uniform_frac{f}": sim["default"][f"frac{f}"]["uniform"]["spearman"]["mean"]
                   for f in fractions},
        holds=holds, paired=paired, paper="PiCO beats Uniform on S, tau, H (Table 2 ablation)",
        comparison="each of S, tau better, H, CIN lower, by 2 SE, each fraction"))
  corr = sim.get("default", {}).get("weights_vs_ability")
  if corr:
    se = results.standard_error(corr["values"])
    claims.append(results.claim(
        "weights_follow_ability", "Learned reviewer weights correlate with reviewer ability "
        "(Spearman > 0.5, mean minus 2 SE over seeds).", ours=corr["mean"],
        baselines={"stderr": se}, holds=bool(corr["mean"] - 2 * se > 0.5),
        paper="stronger models get larger weights (the consistency assumption)",
        comparison="mean Spearman(w, ability) - 2 SE > 0.5"))
  elim = sim.get("default", {}).get("elimination")
  if elim:
    paired = results.paired_comparison(elim["chosen"]["spearman"]["values"],
                                       elim["k0"]["spearman"]["values"], lower_is_better=False)
    claims.append(results.claim(
        "elimination_helps", "Unsupervised elimination: the chosen k raises S over k = 0 "
        "(seed-paired).", ours=elim["chosen"]["spearman"]["mean"],
        baselines={"k0": elim["k0"]["spearman"]["mean"]}, holds=paired["better"],
        paired=paired, paper="eliminating weak reviewers improves the ranking",
        comparison="S(chosen k) - S(k = 0) > 0 by 2 SE"))
  rivals = [m for m in ("majority", "pagerank", "prd") if m in methods]
  if "pico" in methods and rivals and "default" in families and 1.0 in fractions:
    paired = {m: _paired(sim, "default", 1.0, "pico", m, "spearman", False) for m in rivals}
    claims.append(results.claim(
        "pico_beats_voting_pagerank_prd", "Default family, all battles: PiCO's S beats "
        "majority voting, PageRank and PRD (seed-paired).",
        ours=sim["default"]["frac1.0"]["pico"]["spearman"]["mean"],
        baselines={m: sim["default"]["frac1.0"][m]["spearman"]["mean"] for m in rivals},
        holds=all(p["better"] for p in paired.values()), paired=paired,
        paper="Chatbot Arena S: PiCO 0.90, majority 0.76, PRD 0.84",
        comparison="S(PiCO) - S(rival) > 0 by 2 SE, each rival"))
  if {"pico", "uniform"} <= set(methods) and set(FAMILIES) <= set(families) and 1.0 in fractions:
    gain = {fam: np.asarray(sim[fam]["frac1.0"]["pico"]["spearman"]["values"])
            - np.asarray(sim[fam]["frac1.0"]["uniform"]["spearman"]["values"])
            for fam in FAMILIES}
    paired = results.paired_comparison(gain["default"], gain["violated"], lower_is_better=False)
    claims.append(results.claim(
        "gain_shrinks_when_violated", "Boundary (not a paper claim): PiCO's S gain over Uniform "
        "is smaller when reviewer noise is independent of ability (`violated`).",
        ours={fam: float(g.mean()) for fam, g in gain.items()}, holds=paired["better"],
        paired=paired, paper=None,
        comparison="gain(default) - gain(violated) > 0 by 2 SE"))
  return claims


def plot(sim, methods, fractions):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  families = list(f for f in FAMILIES if f in sim)
  figure, axes = plt.subplots(1, len(families), figsize=(6 * len(families), 3.6), squeeze=False)
  width = 0.8 / len(methods)
  for axis, family in zip(axes[0], families):
    for i, method in enumerate(methods):
      means = [sim[family][f"frac{f}"][method]["spearman"]["mean"] for f in fractions]
      stds = [sim[family][f"frac{f}"][method]["spearman"]["std"] for f in fractions]
      axis.bar(np.arange(len(fractions)) + i * width, means, width, yerr=stds, label=method)
    axis.set_xticks(np.arange(len(fractions)) + 0.4 - width / 2, [f"{f:g}" for f in fractions])
    axis.set_xlabel("kept fraction of each reviewer's battles")
    axis.set_ylabel("Spearman S with the true order")
    axis.set_ylim(0, 1.05)
    axis.set_title(f"simulated peer review, {family} family")
    axis.legend(fontsize=7, ncol=2)
  figure.tight_layout()
  return figure


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  methods, families, fractions = options(config)
  seeds = [config.seed + s for s in range(config.num_seeds)]
  real_rates = data.disagreement_rate()
  base = dict(num_questions=int(config.sim.num_questions), opponents=int(config.sim.opponents),
              judge_probability=float(config.sim.judge_probability))
  if config.sim.calibrate:
    spec = simulate.calibrated_spec(real_rates, **base)
  else:
    spec = simulate.SimulationSpec(**base)
  specs = {family: dataclasses.replace(spec, family=family)
           for family in families}
  metrics = {"sim": simulated_study(config, specs, methods, families, fractions, seeds)}
  metrics["real"] = real_study()
  metrics["real"]["calibration"] = {
      "real": real_rates, "simulated": simulate.simulated_rates(specs[families[0]], seeds[0]),
      "position_bias": float(spec.position_bias), "sigma_top": float(spec.sigma_top)}
  metrics["official_logs"] = official_log_study()
  sim = metrics["sim"]
  results.save_figure(plot(sim, methods, fractions), workdir, "spearman_by_method.png", SLUG,
                      config)
  headline = None
  if "pico" in methods and "default" in sim and 1.0 in fractions:
    row = sim["default"]["frac1.0"]["pico"]
    headline = {"name": "simulated peer review, all battles: PiCO S / tau / H",
                "ours": " / ".join(f"{row[m]['mean']:.2f}" for m in ("spearman", "kendall",
                                                                      "pen")),
                "paper": PAPER, "unit": ""}
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics,
                               claims=claims_of(sim, methods, families, fractions),
                               headline_metric=headline, wall_s=time.perf_counter() - start,
                               seeds=seeds)


if __name__ == "__main__":
  cli.run(main)
