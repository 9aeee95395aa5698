"""The quick reproduction: original model, retrain, the baselines and SG over an alpha sweep, in
the `random` and `classwise` forgetting settings; evaluation, claims, plot.

`experiments/sg_unlearn.py` runs these in order; the notebook calls them one by one. Seeds are
replicas trained side by side (vmapped); SG's alpha sweep is one more replica axis, and its
alpha = 0 replicas are the FT baseline (the official code's alpha = 0 is plain FT).
"""
from __future__ import annotations

import os
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_lib
from jaxlab.core import parallel
from jaxlab.core import results
from jaxlab.methods.sg_unlearn import auditor
from jaxlab.methods.sg_unlearn import data as data_lib
from jaxlab.methods.sg_unlearn import evaluation
from jaxlab.methods.sg_unlearn import unlearning

BASELINES = ("original", "retrain", "ft", "ga", "rl", "l1")
# "Similar test accuracy": SG may lose at most this much test accuracy against FT.
TEST_ACC_SLACK = 0.02
# The frontier claim compares alphas whose mean test accuracy is within this of FT's.
MATCHED_TEST_ACC = 0.01
LOSS_CAP = 1e4


def alpha_name(alpha: float) -> str:
  return f"sg_alpha_{alpha:g}"


def settings(config: ml_collections.ConfigDict) -> list[str]:
  return config_lib.select_names(config, "data.settings", data_lib.SETTINGS)


def validate(config: ml_collections.ConfigDict) -> None:
  settings(config)
  alphas = tuple(config.auditor.alphas)
  if not alphas or any(a <= 0 for a in alphas):
    raise config_lib.ConfigError(f"config key 'auditor.alphas' must list positive strengths "
                                 f"(alpha = 0 is FT, always run), got {alphas}")
  if config.auditor.score not in ("loss", "logits_loss"):
    raise config_lib.ConfigError("config key 'auditor.score' must be 'loss' or 'logits_loss'")
  if not 0 < config.data.forget_fraction < 1:
    raise config_lib.ConfigError("config key 'data.forget_fraction' must be in (0, 1)")
  if config.train.original_epochs is not None and config.train.original_epochs < 1:
    raise config_lib.ConfigError("config key 'train.original_epochs' must be >= 1 (or None)")


def recipe(config: ml_collections.ConfigDict, phase: str, num_train: int) -> unlearning.Recipe:
  """The static description of one phase's epochs."""
  o, t, a = config.optim, config.train, config.auditor
  common = dict(batch_size=t.batch_size, momentum=o.momentum, weight_decay=o.weight_decay,
                batches_per_epoch=unlearning.batches_per_epoch(num_train, t.batch_size),
                chunk_epochs=t.eval_every, auditor_l2=a.l2, newton_steps=a.newton_steps,
                score=a.score)
  if phase in ("original", "retrain"):
    return unlearning.Recipe(epochs=t.original_epochs or t.steps,
                             learning_rate=o.original_lr, **common)
  unlearn = dict(epochs=t.steps, **common)
  if phase == "sg":
    return unlearning.Recipe(learning_rate=o.ft_lr, adversarial=True,
                             attacker_lr=o.attacker_lr, **unlearn)
  if phase == "ga":
    return unlearning.Recipe(objective="ascent", learning_rate=o.ga_lr, **unlearn)
  if phase == "rl":
    return unlearning.Recipe(learning_rate=o.rl_lr, **unlearn)
  if phase == "l1":
    return unlearning.Recipe(learning_rate=o.ft_lr, l1=o.l1, **unlearn)
  raise ValueError(f"unknown phase {phase!r}")


def auditor_samples(splits: data_lib.DigitsSplits, forget: np.ndarray, size: int,
                    config: ml_collections.ConfigDict, seed: int, setting: str = "random"
                    ) -> unlearning.AuditorSamples:
  """Forget examples (members) and as many random validation examples (non-members), with the
  (class, fold) masks of the auditor's stratified shuffle splits; padded to 2 `size`.

  Random forgetting: one attacker per class. Class-wise forgetting, as the official code: the
  forgotten class is dropped from the non-members and a single attacker covers every class.
  """
  rng = np.random.default_rng(seed)
  members = np.flatnonzero(forget)
  candidates = np.arange(len(splits.y_val))
  if setting == "classwise":
    candidates = candidates[~np.isin(splits.y_val, np.unique(splits.y_train[members]))]
  nonmembers = rng.choice(candidates, size=min(len(members), len(candidates)), replace=False)
  x = np.concatenate([splits.x_train[members], splits.x_val[nonmembers]])
  y = np.concatenate([splits.y_train[members], splits.y_val[nonmembers]])
  is_member = np.concatenate([np.ones(len(members)), np.zeros(len(nonmembers))]).astype(bool)
  train_w, test_w = auditor.fold_masks(
      y, is_member, num_folds=config.auditor.folds, test_fraction=config.auditor.test_fraction,
      num_classes=data_lib.NUM_CLASSES, seed=seed, per_class=setting != "classwise")
  pad = 2 * size - len(y)
  padded = lambda a: np.concatenate([a, np.zeros((*a.shape[:-1], pad), a.dtype)], axis=-1)
  return unlearning.AuditorSamples(
      x=np.concatenate([x, np.zeros((pad, x.shape[1]), x.dtype)]),
      y=padded(y).astype(np.int32),
      member_sign=padded(np.where(is_member, 1.0, -1.0)).astype(np.float32),
      train_weights=padded(train_w).astype(np.float32),
      test_weights=padded(test_w).astype(np.float32))


def _stack(trees):
  return jax.tree.map(lambda *xs: np.stack(xs), *trees)


def replica_inputs(keys, base_weights, base_labels, alphas, samples) -> unlearning.ReplicaInputs:
  return unlearning.ReplicaInputs(
      key=jnp.stack(keys), base_weights=np.stack(base_weights).astype(np.float32),
      base_labels=np.stack(base_labels).astype(np.int32),
      alpha=np.asarray(alphas, np.float32), auditor=_stack(samples))


def model_outputs(model, params, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(losses [R, N], correct [R, N]) of replica-stacked parameters."""
  def one(p):
    logits = model.apply(p, x)
    return unlearning.per_example_ce(logits, y), jnp.argmax(logits, -1) == y
  losses, correct = jax.jit(jax.vmap(one))(params)
  # A diverged model (gradient ascent can run away) still gets scored: as maximally wrong.
  losses = np.nan_to_num(np.asarray(losses), nan=LOSS_CAP, posinf=LOSS_CAP)
  return np.minimum(losses, LOSS_CAP), np.asarray(correct)


def evaluate_replicas(model, params, splits: data_lib.DigitsSplits, forget_masks: list[np.ndarray],
                      config: ml_collections.ConfigDict, seeds: list[int]) -> list[dict[str, Any]]:
  """Evaluation metrics per replica, plus the model-selection score val_acc - val MIA acc."""
  train_losses, train_correct = model_outputs(model, params, splits.x_train, splits.y_train)
  test_losses, test_correct = model_outputs(model, params, splits.x_test, splits.y_test)
  val_losses, val_correct = model_outputs(model, params, splits.x_val, splits.y_val)
  out = []
  for r, (forget, seed) in enumerate(zip(forget_masks, seeds)):
    m = evaluation.evaluate(train_losses=train_losses[r], train_correct=train_correct[r],
                            forget=forget, test_losses=test_losses[r],
                            test_correct=test_correct[r], mia_folds=config.eval.mia_folds,
                            seed=seed)
    val_mia, _ = evaluation.membership_attack(train_losses[r][forget], val_losses[r],
                                              folds=config.eval.mia_folds, seed=seed)
    m["selection"] = float(np.mean(val_correct[r])) - val_mia
    out.append(m)
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> tuple[dict[str, Any], float]:
  """Every phase of every setting; returns {setting: {method: [per-seed metric dicts]}} and the
  time that resumed phases had already spent."""
  splits = data_lib.load_splits(config.data.num_train, seed=config.data.split_seed,
                                pixel_noise=config.data.pixel_noise,
                                data_dir=config.data.data_dir)
  seeds = [config.seed + s for s in range(config.data.num_seeds)]
  alphas = [0.0, *config.auditor.alphas]
  model = unlearning.classifier(tuple(config.model.hidden))
  mesh = parallel.make_mesh(config.mesh)
  num_train = len(splits.y_train)
  ones = np.ones(num_train, np.float32)
  earlier_s = 0.0
  progress = config.train.progress

  def phase(name, init_params, inputs, subdir):
    nonlocal earlier_s
    result = unlearning.run_phase(model, recipe(config, name, num_train), init_params, inputs,
                                  splits.x_train, mesh=mesh,
                                  workdir=os.path.join(workdir, subdir), desc=subdir,
                                  progress=progress)
    earlier_s += result.earlier_s
    return result.params

  # The auditor arrays of phases without an adversarial step are never read; any seed's will do.
  size = max(int(data_lib.forget_mask(splits.y_train, s, seed, fraction=config.data.
                                      forget_fraction).sum()) for s in settings(config)
             for seed in seeds)
  placeholder = [auditor_samples(splits, data_lib.forget_mask(
      splits.y_train, "random", seed, fraction=config.data.forget_fraction), size, config, seed)
                 for seed in seeds]
  keys = [jax.random.key(seed) for seed in seeds]
  init_params = jax.vmap(model.init)(jnp.stack(keys))
  original = phase("original", init_params, replica_inputs(
      keys, [ones] * len(seeds), [splits.y_train] * len(seeds), [0.0] * len(seeds),
      placeholder), "original")

  outcome: dict[str, Any] = {}
  for setting in metrics_lib.progress_iter(settings(config), "settings", enabled=progress):
    forget = [data_lib.forget_mask(splits.y_train, setting, seed,
                                   fraction=config.data.forget_fraction) for seed in seeds]
    retain = [(~f).astype(np.float32) for f in forget]
    samples = [auditor_samples(splits, f, size, config, seed, setting)
               for f, seed in zip(forget, seeds)]
    true_labels = [splits.y_train] * len(seeds)
    no_alpha = [0.0] * len(seeds)
    params = {"original": original}
    retrain_keys = [jax.random.fold_in(k, 1) for k in keys]
    params["retrain"] = phase("retrain", jax.vmap(model.init)(jnp.stack(retrain_keys)),
                              replica_inputs(retrain_keys, retain, true_labels, no_alpha,
                                             samples), f"{setting}/retrain")
    unlearn_keys = [jax.random.fold_in(k, 2) for k in keys]
    params["ga"] = phase("ga", original, replica_inputs(
        unlearn_keys, [f.astype(np.float32) for f in forget], true_labels, no_alpha, samples),
                         f"{setting}/ga")
    wrong = [np.where(f, data_lib.wrong_labels(splits.y_train, seed), splits.y_train)
             for f, seed in zip(forget, seeds)]
    params["rl"] = phase("rl", original, replica_inputs(unlearn_keys, [ones] * len(seeds), wrong,
                                                        no_alpha, samples), f"{setting}/rl")
    params["l1"] = phase("l1", original, replica_inputs(unlearn_keys, retain, true_labels,
                                                        no_alpha, samples), f"{setting}/l1")
    # SG: replicas ordered (alpha, seed); alpha = 0 is FT.
    tiled = jax.tree.map(lambda a: jnp.concatenate([a] * len(alphas)), original)
    sg = phase("sg", tiled, replica_inputs(
        unlearn_keys * len(alphas), retain * len(alphas), true_labels * len(alphas),
        [a for a in alphas for _ in seeds], samples * len(alphas)), f"{setting}/sg")
    for i, alpha in enumerate(alphas):
      name = "ft" if alpha == 0 else alpha_name(alpha)
      params[name] = jax.tree.map(lambda a, i=i: a[i * len(seeds):(i + 1) * len(seeds)], sg)
    outcome[setting] = {name: evaluate_replicas(model, p, splits, forget, config, seeds)
                        for name, p in params.items()}
  return outcome, earlier_s


MIA_METRICS = ("mia_acc", "mia_auc")
REPORTED = ("test_acc", "mia_acc", "mia_auc")


def summarize(outcome: dict[str, Any]) -> dict[str, Any]:
  """Per `<setting>.<method>`: seed means of every metric with gap_to_retrain and the selection
  score; `seed_std` (the spread over seeds) and `stderr` of the reported metrics; `<metric>_gap`
  (|method - retrain| per seed for the MIA accuracy and AUC) with its `stderr`; and every seed's
  values in `per_seed`."""
  summary: dict[str, Any] = {}
  for setting, methods in outcome.items():
    retrain_runs = methods["retrain"]
    for name, runs in methods.items():
      for run, retrain_run in zip(runs, retrain_runs):
        run["gap_to_retrain"] = evaluation.gap_to_retrain(run, retrain_run)
        for k in MIA_METRICS:
          run[f"{k}_gap"] = abs(run[k] - retrain_run[k])
      keys = (*evaluation.METRICS, "gap_to_retrain", "selection",
              *(f"{k}_gap" for k in MIA_METRICS))
      entry = {k: float(np.mean([r[k] for r in runs])) for k in keys}
      reported = (*REPORTED, *(f"{k}_gap" for k in MIA_METRICS))
      entry["seed_std"] = {k: float(np.std([r[k] for r in runs])) for k in REPORTED}
      entry["stderr"] = {k: results.standard_error([r[k] for r in runs]) for k in reported}
      entry["per_seed"] = {k: [float(r[k]) for r in runs] for k in reported}
      summary.setdefault(setting, {})[name] = entry
  return summary


def _closer_than_ft(methods: dict[str, Any], name: str) -> dict[str, Any]:
  """Paired over seeds: |name - retrain| against |FT - retrain|, for MIA accuracy and AUC."""
  return {k: results.paired_comparison(methods[name]["per_seed"][f"{k}_gap"],
                                       methods["ft"]["per_seed"][f"{k}_gap"],
                                       lower_is_better=True) for k in MIA_METRICS}


def claims(summary: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
  """Per setting, two claims against FT, decided over seeds by `results.paired_comparison`:

  * selection: SG at the alpha the paper's rule picks (highest mean val acc - val MIA acc)
    has MIA accuracy and AUC closer to retrain than FT, at similar test accuracy;
  * frontier: at matched test accuracy (mean within `MATCHED_TEST_ACC` of FT's), some alpha > 0
    is closer to retrain than FT on both, each by more than two standard errors.
  """
  out, headline = [], None
  for setting, methods in summary.items():
    sg_names = [n for n in methods if n.startswith("sg_alpha_")]
    chosen = max(sg_names, key=lambda n: methods[n]["selection"])
    retrain, ft, sg = methods["retrain"], methods["ft"], methods[chosen]
    paired = _closer_than_ft(methods, chosen)
    similar = sg["test_acc"] >= ft["test_acc"] - TEST_ACC_SLACK
    out.append(results.claim(
        f"sg_closer_to_retrain_{setting}",
        f"{setting} forgetting: SG (alpha chosen on validation: {chosen}) brings the MIA accuracy "
        f"and AUC closer to retrain than FT at similar test accuracy",
        ours={"mia_acc_gap": sg["mia_acc_gap"], "mia_auc_gap": sg["mia_auc_gap"],
              "test_acc": sg["test_acc"]},
        baselines={"ft_mia_acc_gap": ft["mia_acc_gap"], "ft_mia_auc_gap": ft["mia_auc_gap"],
                   "ft_test_acc": ft["test_acc"], "retrain_mia_auc": retrain["mia_auc"]},
        holds=all(p["better"] for p in paired.values()) and similar, paired=paired,
        paper="SG closest to retrain in MIA at similar test accuracy",
        comparison=f"paired over seeds: |SG - retrain| < |FT - retrain| for MIA acc and AUC "
                   f"(> 2 s.e.), and SG test acc >= FT test acc - {TEST_ACC_SLACK}"))
    matched = [n for n in sg_names
               if abs(methods[n]["test_acc"] - ft["test_acc"]) <= MATCHED_TEST_ACC]
    frontier = {n: _closer_than_ft(methods, n) for n in matched}
    winners = [n for n, p in frontier.items() if all(c["better"] for c in p.values())]
    best = min(matched, key=lambda n: methods[n]["mia_acc_gap"] + methods[n]["mia_auc_gap"],
               default=None)
    out.append(results.claim(
        f"sg_frontier_{setting}",
        f"{setting} forgetting: at matched test accuracy (within {MATCHED_TEST_ACC:g} of FT), "
        f"some alpha > 0 brings the MIA accuracy and AUC closer to retrain than FT",
        ours={"matched_alphas": matched, "significant": winners, "best": best,
              **({"best_mia_acc_gap": methods[best]["mia_acc_gap"],
                  "best_mia_auc_gap": methods[best]["mia_auc_gap"]} if best else {})},
        baselines={"ft_mia_acc_gap": ft["mia_acc_gap"], "ft_mia_auc_gap": ft["mia_auc_gap"]},
        holds=bool(winners), paired={f"{n} {k}": c for n, p in frontier.items()
                                     for k, c in p.items()} or None,
        paper="SG's MIA-accuracy frontier lies closer to retrain than FT's (paper's figures)",
        comparison=f"paired over seeds, for some alpha with |test acc - FT's| <= "
                   f"{MATCHED_TEST_ACC:g}: |SG - retrain| < |FT - retrain| by > 2 s.e. for MIA "
                   f"acc and AUC ({len(matched)} alphas tested, no multiple-comparison "
                   f"correction)"))
    if setting == "random":
      headline = results.headline(
          "random forgetting: MIA AUC (retrain / FT / SG)",
          ours=f"{retrain['mia_auc']:.3f} / {ft['mia_auc']:.3f} / {sg['mia_auc']:.3f}",
          paper="SG closest to retrain")
  return out, headline


def plot(summary: dict[str, Any]):
  """MIA AUC against test accuracy per method (seed means, bars: one standard error), one panel
  per setting."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt

  figure, axes = plt.subplots(1, len(summary), figsize=(6 * len(summary), 4.5), squeeze=False)
  for ax, (setting, methods) in zip(axes[0], summary.items()):
    for name, m in methods.items():
      marker = "*" if name == "retrain" else ("o" if name.startswith("sg") else "s")
      ax.errorbar(m["test_acc"], m["mia_auc"], xerr=m["stderr"]["test_acc"],
                  yerr=m["stderr"]["mia_auc"], fmt=marker, markersize=9 if marker == "*" else 6,
                  capsize=2, lw=0.8)
      ax.annotate(name.replace("sg_alpha_", "SG α="), (m["test_acc"], m["mia_auc"]),
                  fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.axhline(methods["retrain"]["mia_auc"], color="grey", lw=0.6, ls="--")
    ax.set_xlabel("test accuracy")
    ax.set_ylabel("MIA AUC (forget vs test)")
    ax.set_title(f"{setting} forgetting")
  figure.tight_layout()
  return figure
