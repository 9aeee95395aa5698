"""semantix reproduction: energy-guided semantic style transfer on ray-cast scenes, with claims.

  python -m experiments.semantix --config=configs/semantix.py:quick

Loads (or trains once, cached) the scenes prior, chooses the guidance strength and the position
weight on validation pairs of another seed, runs every method on the reported pairs with the
same keys, and writes `<workdir>/results.json` (for the quick preset also
`results/semantix.json`) and a grid of context, reference, ideal and every method's output.

Resumable: the tuning table and every method's outputs are kept under
`<workdir>/stages/<config hash>/`, so a rerun with the same config skips what an interrupted run
finished (the prior is cached outside the workdir).
"""
from __future__ import annotations

import itertools
import json
import os
import time

from flax import nnx
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from jaxlab.core import cli
from jaxlab.core import config as config_lib
from jaxlab.core import metrics as metrics_progress
from jaxlab.core import parallel
from jaxlab.core import results
from jaxlab.data import scenes
from jaxlab.diffusion import priors
from jaxlab.methods.semantix import energy as energy_lib
from jaxlab.methods.semantix import metrics as metrics_lib
from jaxlab.methods.semantix import transfer as transfer_lib

SLUG = "semantix"
PAPER = "qualitative: beats style/appearance-transfer baselines (COCO x WikiArt, Stable Diffusion)"
BASELINES_FOR_COLOUR = ("global_guidance", "kv_injection", "adain_sdedit")


def prior_unet(spec: priors.PriorSpec):
  """The prior's UNet as an abstract module (names of its taps and attention layers)."""
  model, _ = priors.network(spec)
  return nnx.eval_shape(lambda: model.factory(nnx.Rngs(0)))


def settings(config: ml_collections.ConfigDict):
  """(Settings, methods, prior spec), every value checked before anything compiles."""
  methods = config_lib.select_names(config, "methods", transfer_lib.METHODS)
  g, s = config.guidance, config.sampler
  try:
    spec = priors.PriorSpec.from_config(config.prior)
  except priors.SpecError as e:
    raise config_lib.ConfigError(f"prior.{e.key}: {e.reason}") from None
  try:
    run = transfer_lib.Settings(
        visited=s.visited, t_start=s.t_start, t_stop=s.t_stop, sdedit_start=s.sdedit_start,
        normalize_gradient=s.normalize_gradient, style_taps=tuple(g.style_taps),
        spatial_taps=tuple(g.spatial_taps), sd_tap=g.sd_tap, match_tap=g.match_tap,
        soft_temperature=g.soft_temperature, kv_layers=tuple(config.kv_injection.layers),
        kv_query_blend=config.kv_injection.query_blend,
        kv_temperature=config.kv_injection.temperature)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  try:
    transfer_lib.visited_steps(run, spec.num_steps)
  except ValueError as e:
    raise config_lib.ConfigError(f"sampler: {e}") from None
  unet = prior_unet(spec)
  try:
    transfer_lib.check_taps(run, unet.tap_names(), unet.attention_names())
  except ValueError as e:
    raise config_lib.ConfigError(f"guidance: {e}") from None
  config_lib.require(config.data.num_pairs >= 2, "data.num_pairs",
                     "the claims pair methods over pairs: need >= 2")
  config_lib.require(config.data.pair_seed != config.data.validation_seed,
                     "data.validation_seed", "validation pairs must come from another seed")
  return run, methods, spec


def invert_pairs(prior, run, pairs, batch_size, seed, mesh) -> list:
  """The inversions of every batch of pairs (batch b: key fold_in(seed, b)), shared by every
  method and every tuning run. Each batch is split over `mesh` (where `prior` is replicated,
  `priors.replicated_on`): the inversions, and every transfer from them, run data-parallel."""
  sharding = parallel.data_sharded(mesh)
  out = []
  for index, begin in enumerate(range(0, len(pairs["context"]), batch_size)):
    part = slice(begin, begin + batch_size)
    key = jax.random.fold_in(jax.random.key(seed), index)
    context, reference = parallel.put((np.asarray(pairs["context"][part]),
                                       np.asarray(pairs["reference"][part])), sharding)
    out.append((part, key, transfer_lib.invert(prior, context, reference,
                                               jax.random.split(key)[0], run)))
  return out


def run_method(prior, run, method, weights, pairs, inverted) -> np.ndarray:
  """Outputs [N, H, W, 3] in [0, 1] of one method over the inverted batches."""
  return np.concatenate([parallel.fetch(transfer_lib.transfer(
      prior, pairs["context"][part], pairs["reference"][part], key, run, method, weights,
      inverted=inv)) for part, key, inv in inverted])


def scores(outputs, pairs) -> dict[str, np.ndarray]:
  return {"ideal_psnr": metrics_lib.psnr(outputs, pairs["ideal"]),
          "ideal_ssim": metrics_lib.ssim(outputs, pairs["ideal"]),
          "class_colour_error": metrics_lib.class_colour_error(outputs, pairs["ideal"],
                                                               pairs["context_classes"])}


def tune(prior, run, config, validation, methods, progress, mesh) -> dict:
  """The guidance settings, by the lowest mean class colour error on the validation pairs (never
  the reported ones), in two stages for `semantix` (its ablations reuse the result): eta x PE
  weight at l_p = l_d = 1 (l_s = 1 sets the scale: the gradient is normalised), then l_p x l_d
  at the chosen eta and PE weight. `global_guidance` gets its own eta."""
  g = config.guidance
  inverted = invert_pairs(prior, run, validation, config.data.batch_size, config.seed + 1, mesh)
  table = []

  def error(method, eta, pe, spatial, sd):
    weights = transfer_lib.method_weights(method, eta, g.style_weight, spatial, sd, pe)
    out = run_method(prior, run, method, weights, validation, inverted)
    value = float(scores(out, validation)["class_colour_error"].mean())
    table.append({"method": method, "eta": eta, "pe_weight": pe, "spatial_weight": spatial,
                  "sd_weight": sd, "class_colour_error": value})
    progress.update(len(table))
    return value

  base = dict(eta=g.eta, pe_weight=g.pe_weight, spatial_weight=g.spatial_weight,
              sd_weight=g.sd_weight)
  chosen = {"semantix": dict(base), "global_guidance": dict(base)}
  energy_methods = [m for m in methods if m in transfer_lib.ENERGY_METHODS]
  if any(m != "global_guidance" for m in energy_methods):
    s = chosen["semantix"]
    s["eta"], s["pe_weight"] = min(
        itertools.product(g.eta_grid, g.pe_weight_grid),
        key=lambda c: error("semantix", c[0], c[1], s["spatial_weight"], s["sd_weight"]))
    s["spatial_weight"], s["sd_weight"] = min(
        itertools.product(g.spatial_weight_grid, g.sd_weight_grid),
        key=lambda c: error("semantix", s["eta"], s["pe_weight"], c[0], c[1]))
  if "global_guidance" in methods:
    s = chosen["global_guidance"]
    s["eta"] = min(g.eta_grid, key=lambda eta: error("global_guidance", eta, s["pe_weight"],
                                                     s["spatial_weight"], s["sd_weight"]))
  return {"chosen": chosen, "grid": table}


def save_arrays(path: str, **arrays) -> None:
  """An .npz on process 0, through a rename (as `write_json`): a killed run leaves no half file."""
  if jax.process_index() != 0:
    return
  # A file object: given a name, np.savez would append ".npz" to the temporary one.
  with metrics_progress.atomic_file(path, "wb") as f:
    np.savez(f, **arrays)


def tuned_once(prior, run, config, validation, methods, stages: str, mesh) -> dict:
  path = os.path.join(stages, "tuning.json")
  if os.path.exists(path):
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  bar = metrics_progress.Progress(tuning_runs(config, methods), desc="semantix tuning",
                                  enabled=config.train.progress, show_rate=False)
  try:
    tuned = tune(prior, run, config, validation, methods, bar, mesh)
  finally:
    bar.close()
  metrics_progress.write_json(path, tuned)
  return tuned


def tuning_runs(config, methods) -> int:
  g = config.guidance
  count = 0
  if any(m in transfer_lib.ENERGY_METHODS and m != "global_guidance" for m in methods):
    count += (len(g.eta_grid) * len(g.pe_weight_grid)
              + len(g.spatial_weight_grid) * len(g.sd_weight_grid))
  if "global_guidance" in methods:
    count += len(g.eta_grid)
  return count


def correspondence_accuracy(prior, run, pairs, pe_weight: float, batch: int = 16) -> dict:
  """Share of context positions matched into the same class, at the first guided step, for
  features + PE, features only and PE only."""
  steps, start, _ = transfer_lib.visited_steps(run, prior.schedule.num_steps)
  t = int(steps[start])
  alpha_bar = prior.schedule.alphas_cumprod[t]

  @jax.jit
  def features(x, key):
    noisy = jnp.sqrt(alpha_bar) * x + jnp.sqrt(1 - alpha_bar) * jax.random.normal(key, x.shape)
    return prior.apply(prior.params, noisy, jnp.full((x.shape[0],), t, jnp.int32),
                       taps=(run.match_tap,))[1][run.match_tap]

  variants = {"features_pe": (1.0, pe_weight), "features_only": (1.0, 0.0),
              "pe_only": (0.0, 1.0)}
  found = {name: [] for name in variants}
  for begin in range(0, len(pairs["context"]), batch):
    part = slice(begin, begin + batch)
    key = jax.random.key(begin)
    ctx = features(jnp.asarray(pairs["context"][part]) * 2 - 1, key)
    ref = features(jnp.asarray(pairs["reference"][part]) * 2 - 1, jax.random.fold_in(key, 1))
    for name, (feature_weight, pe) in variants.items():
      weights = energy_lib.correspondence(ctx, ref, pe_weight=pe, feature_weight=feature_weight)
      found[name].append(metrics_lib.class_agreement(
          np.asarray(weights), pairs["context_classes"][part], pairs["reference_classes"][part]))
  return {name: np.concatenate(v) for name, v in found.items()}


def summarise(values: np.ndarray) -> dict:
  return {"mean": float(np.mean(values)), "stderr": results.standard_error(values),
          "pairs": [float(v) for v in values]}


def claims_of(per_method: dict, correspondence: dict) -> list[dict]:
  claims = []
  have = per_method.keys()
  colour = lambda m: per_method[m]["class_colour_error"]
  if "semantix" not in have:
    return claims
  against = [b for b in BASELINES_FOR_COLOUR if b in have]
  if against:
    paired = {b: results.paired_comparison(colour("semantix"), colour(b), lower_is_better=True)
              for b in against}
    claims.append(results.claim(
        "colour_beats_baselines",
        "Semantix's class colour error (output vs ideal mean RGB per semantic class) is below "
        "global feature-statistics guidance, K/V injection and AdaIN + SDEdit (paired over "
        "pairs).", ours=float(colour("semantix").mean()),
        baselines={b: float(colour(b).mean()) for b in against},
        holds=all(p["better"] for p in paired.values()), paired=paired, paper=PAPER,
        comparison="colour_error(semantix) - colour_error(baseline) < 0 by 2 SE, each"))
  against = [b for b in ("reconstruction", "adain_sdedit") if b in have]
  if against:
    psnr = lambda m: per_method[m]["ideal_psnr"]
    paired = {b: results.paired_comparison(psnr("semantix"), psnr(b), lower_is_better=False)
              for b in against}
    claims.append(results.claim(
        "psnr_beats_reconstruction_and_sdedit",
        "Semantix's PSNR against the ideal restyled render beats reconstruction (no guidance) "
        "and AdaIN + SDEdit.", ours=float(psnr("semantix").mean()),
        baselines={b: float(psnr(b).mean()) for b in against},
        holds=all(p["better"] for p in paired.values()), paired=paired, paper=PAPER,
        comparison="psnr(semantix) - psnr(baseline) > 0 by 2 SE, each"))
  paired = results.paired_comparison(correspondence["features_pe"], correspondence["pe_only"],
                                     lower_is_better=False)
  claims.append(results.claim(
      "features_beat_position_only",
      "Matching on features with the position code puts more context positions on the same "
      "semantic class of the reference than the position code alone.",
      ours=float(correspondence["features_pe"].mean()),
      baselines={"pe_only": float(correspondence["pe_only"].mean()),
                 "features_only": float(correspondence["features_only"].mean())},
      holds=paired["better"], paired=paired, paper="semantic correspondence (reconstructed)",
      comparison="class_agreement(features + PE) - class_agreement(PE only) > 0 by 2 SE"))
  if "no_style" in have:
    paired = results.paired_comparison(colour("no_style"), colour("semantix"),
                                       lower_is_better=False)
    claims.append(results.claim(
        "style_term_lowers_colour_error",
        "Dropping the style term raises the class colour error.",
        ours=float(colour("no_style").mean()), baselines={"semantix": float(colour(
            "semantix").mean())}, holds=paired["better"], paired=paired, paper=PAPER,
        comparison="colour_error(no_style) - colour_error(semantix) > 0 by 2 SE"))
  if "no_spatial" in have:
    ssim = lambda m: per_method[m]["ideal_ssim"]
    paired = results.paired_comparison(ssim("no_spatial"), ssim("semantix"),
                                       lower_is_better=True)
    claims.append(results.claim(
        "spatial_term_keeps_structure",
        "Dropping the spatial term lowers SSIM against the ideal (structure is lost).",
        ours=float(ssim("no_spatial").mean()), baselines={"semantix": float(ssim(
            "semantix").mean())}, holds=paired["better"], paired=paired, paper=PAPER,
        comparison="ssim(no_spatial) - ssim(semantix) < 0 by 2 SE"))
  return claims


def plot(pairs: dict, outputs: dict, count: int = 6):
  import matplotlib  # pylint: disable=g-import-not-at-top
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=g-import-not-at-top
  columns = [("context", pairs["context"]), ("reference", pairs["reference"]),
             ("ideal", pairs["ideal"])] + list(outputs.items())
  count = min(count, len(pairs["context"]))
  figure, axes = plt.subplots(count, len(columns), figsize=(1.3 * len(columns), 1.35 * count),
                              squeeze=False)
  for row in range(count):
    for column, (name, images) in enumerate(columns):
      axis = axes[row, column]
      axis.imshow(np.clip(images[row], 0, 1), interpolation="nearest")
      axis.set_xticks([])
      axis.set_yticks([])
      if row == 0:
        axis.set_title(name.replace("_", "\n"), fontsize=7)
  figure.tight_layout()
  return figure


def main(config: ml_collections.ConfigDict, workdir: str) -> dict:
  start = time.perf_counter()
  run, methods, spec = settings(config)
  prior = priors.load_or_train(spec, config.prior.cache_dir, progress=config.train.progress)
  mesh = parallel.batch_mesh(config.data.batch_size, config.mesh)
  prior = priors.replicated_on(prior, mesh)
  pairs = scenes.semantix_pairs(config.data.num_pairs, config.data.pair_seed,
                                size=config.data.size)
  validation = scenes.semantix_pairs(config.data.num_validation, config.data.validation_seed,
                                     size=config.data.size)
  stages = config_lib.stage_dir(config, workdir)
  tuned = tuned_once(prior, run, config, validation, methods, stages, mesh)
  g = config.guidance
  inversions = {}

  def inverted_pairs():
    """The reported pairs' inversions, computed when the first unfinished method needs them."""
    if not inversions:
      tic = time.perf_counter()
      inversions["batches"] = invert_pairs(prior, run, pairs, config.data.batch_size,
                                           config.seed, mesh)
      inversions["s_per_pair"] = (time.perf_counter() - tic) / len(pairs["context"])
    return inversions["batches"]

  per_method, outputs, seconds = {}, {}, {}
  bar = metrics_progress.Progress(len(methods), desc="semantix methods",
                                  enabled=config.train.progress, show_rate=False)
  try:
    for index, method in enumerate(methods):
      chosen = tuned["chosen"]["global_guidance" if method == "global_guidance" else "semantix"]
      weights = transfer_lib.method_weights(method, chosen["eta"], g.style_weight,
                                            chosen["spatial_weight"], chosen["sd_weight"],
                                            chosen["pe_weight"])
      path = os.path.join(stages, f"{method}.npz")
      if os.path.exists(path):
        with np.load(path) as saved:
          outputs[method], seconds[method] = saved["outputs"], float(saved["s_per_pair"])
      else:
        inverted = inverted_pairs()
        tic = time.perf_counter()
        outputs[method] = run_method(prior, run, method, weights, pairs, inverted)
        # Every method but AdaIN + SDEdit needs the two inversions: count them in.
        seconds[method] = ((time.perf_counter() - tic) / len(pairs["context"])
                           + (inversions["s_per_pair"] if method != "adain_sdedit" else 0.0))
        save_arrays(path, outputs=outputs[method], s_per_pair=seconds[method])
      per_method[method] = scores(outputs[method], pairs)
      bar.update(index + 1, {"loss": float(per_method[method]["class_colour_error"].mean())})
  finally:
    bar.close()
  correspondence = correspondence_accuracy(prior, run, pairs,
                                           tuned["chosen"]["semantix"]["pe_weight"])
  metrics = {method: {name: summarise(values) for name, values in found.items()}
             for method, found in per_method.items()}
  metrics["correspondence"] = {name: summarise(v) for name, v in correspondence.items()}
  metrics["s_per_pair"] = seconds
  metrics["tuning"] = tuned
  metrics["prior"] = {"source": prior.source, "train_s": prior.train_s, "key": spec.key(),
                      "steps": spec.steps}
  claims = claims_of(per_method, correspondence)
  results.save_figure(plot(pairs, outputs), workdir, "grid.png", SLUG, config)
  headline = None
  if "semantix" in metrics:
    others = [b for b in BASELINES_FOR_COLOUR if b in metrics]
    colour = lambda m: metrics[m]["class_colour_error"]["mean"]
    headline = {"name": "class colour error vs the ideal render: Semantix vs "
                        + " / ".join(others),
                "ours": f"{colour('semantix'):.3f}" + (" vs " + " / ".join(
                    f"{colour(m):.3f}" for m in others) if others else ""),
                "paper": PAPER, "unit": ""}
  return results.write_results(workdir, slug=SLUG, config=config, metrics=metrics, claims=claims,
                               headline_metric=headline, wall_s=time.perf_counter() - start,
                               seeds=[config.seed])


if __name__ == "__main__":
  cli.run(main)
