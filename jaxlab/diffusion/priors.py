"""Pretrained diffusion priors: trained once per specification, cached on disk, loaded after.

Several methods start from "a pretrained diffusion model" (a purifier to fine-tune, a policy to
control). A `PriorSpec` says everything that determines one: the dataset and image size, the
denoiser (zoo kind and architecture), what it predicts, the noise schedule and its T, the
training settings and the seed. `load_or_train(spec)` trains it with the shared loop
(`core.train_loop`: resumable, checkpointed) in

    <cache>/<dataset>-<hash of the spec and FORMAT_VERSION>/

next to a `spec.json`, and returns the EMA weights; a later call with the same spec finds the
finished checkpoint and trains 0 steps (`Prior.source` says "trained", "resumed" or "loaded").
The cache is `cache_dir` if given, else `$JAXLAB_CACHE/priors`, else `~/.cache/jaxlab/priors`.

Training (DDPM's): the denoiser regresses its target (eps, x0 or v) at t ~ U{0..T-1}, Adam with a
linear warm-up then cosine decay, gradient clipping, and an EMA of the weights with the warm-up
decay min(ema_max, 1 - (1 + step)^-ema_power).

Datasets are a registry of `jaxlab/data` loaders (`DATASETS`): images as float32 [N, H, W, C] in
[-1, 1], and 2-D toy points [N, 2].
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
from typing import Any, Callable, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import config as config_lib
from jaxlab.core import parallel
from jaxlab.core import train_loop
from jaxlab.data import digits
from jaxlab.data import pipeline
from jaxlab.data import scenes
from jaxlab.data import toy2d
from jaxlab.diffusion import denoisers
from jaxlab.diffusion import schedules

# Bump when the training recipe or the checkpoint layout changes: every cached prior retrains.
FORMAT_VERSION = 1
CACHE_ENV = "JAXLAB_CACHE"
SCHEDULES = ("linear", "cosine")
SCHEDULE_BETAS = {"linear": schedules.linear_betas, "cosine": schedules.cosine_betas}
# The largest alpha_bar_T a prior may keep: its sampler starts from N(0, I).
MAX_TERMINAL_ALPHA_BAR = 0.01
SOURCES = ("trained", "resumed", "loaded")


class SpecError(ValueError):
  """A prior spec with a bad value; `key` names the field."""

  def __init__(self, key: str, reason: str):
    super().__init__(f"prior spec: {key} {reason}")
    self.key, self.reason = key, reason


@dataclasses.dataclass(frozen=True)
class Dataset:
  """A registry entry: the training images and their shape, from (size, options, data_dir)."""
  load: Callable[[int, Mapping[str, Any], str | None], np.ndarray]
  sample_shape: Callable[[int, Mapping[str, Any]], tuple[int, ...]]
  default_options: Mapping[str, Any]


def _digits_train_images(size, options, data_dir):
  return digits.scaled_arrays("train", size=size, num_test=options["num_test"],
                              seed=options["split_seed"], data_dir=data_dir)[0]


def _scene_train_images(size, options, data_dir):
  config = scenes.scenes_config(size=size, num_train=options["num_train"], num_test=1,
                                seed=options["seed"])
  return scenes.load_arrays("train", config, data_dir)["image"] * 2.0 - 1.0


def _ring_points(size, options, data_dir):
  del data_dir
  return toy2d.gaussian_ring(size, seed=options["seed"], modes=options["modes"],
                             radius=options["radius"], std=options["std"])


DATASETS: dict[str, Dataset] = {
    # scikit-learn's 8x8 digits (upsampled to size x size); the split keeps num_test images out.
    "digits": Dataset(load=_digits_train_images,
                      sample_shape=lambda size, options: (size, size, digits.IMAGE_SHAPE[-1]),
                      default_options={"num_test": 360, "split_seed": 0}),
    # Ray-cast scenes (ground, wall, 1-4 textured objects) of `scenes`' train distribution.
    "scenes": Dataset(load=_scene_train_images,
                      sample_shape=lambda size, options: (size, size, 3),
                      default_options={"num_train": 2000, "seed": 0}),
    # 2-D points of the 8-Gaussian ring; `size` is the number of training points.
    "gaussian_ring": Dataset(load=_ring_points, sample_shape=lambda size, options: (2,),
                             default_options={"seed": 0, "modes": 8, "radius": 2.0,
                                              "std": 0.2}),
}


def _canonical(value: Any) -> Any:
  """JSON-stable form: tuples and lists as lists, mappings as sorted dicts."""
  if isinstance(value, Mapping):
    return {k: _canonical(value[k]) for k in sorted(value)}
  if isinstance(value, (list, tuple)):
    return [_canonical(v) for v in value]
  return value


@dataclasses.dataclass(frozen=True)
class PriorSpec:
  """Everything that determines a pretrained prior (and so its cache directory)."""
  dataset: str
  size: int
  denoiser: str
  parameterization: str
  schedule: str
  num_steps: int                   # T
  steps: int                       # training steps
  batch_size: int
  lr: float
  warmup_fraction: float
  grad_clip: float
  ema_max: float
  ema_power: float
  seed: int
  architecture: tuple[tuple[str, Any], ...] = ()      # the denoiser's options, complete
  dataset_options: tuple[tuple[str, Any], ...] = ()   # the dataset's options, complete

  def __post_init__(self):
    def fail(key, message):
      raise SpecError(key, message)
    if self.dataset not in DATASETS:
      fail("dataset", f"{self.dataset!r} is not one of {', '.join(DATASETS)}")
    if self.denoiser not in denoisers.KINDS:
      fail("denoiser", f"{self.denoiser!r} is not one of {', '.join(denoisers.KINDS)}")
    if self.parameterization not in schedules.PARAMETERIZATIONS:
      fail("parameterization", f"{self.parameterization!r} is not one of "
           f"{', '.join(schedules.PARAMETERIZATIONS)}")
    if self.schedule not in SCHEDULES:
      fail("schedule", f"{self.schedule!r} is not one of {', '.join(SCHEDULES)}")
    for key in ("size", "num_steps", "steps", "batch_size"):
      if int(getattr(self, key)) < 1:
        fail(key, f"must be positive, got {getattr(self, key)}")
    if self.num_steps < 2:
      fail("num_steps", f"must be at least 2, got {self.num_steps}")
    terminal = schedules.terminal_alpha_bar(SCHEDULE_BETAS[self.schedule](self.num_steps))
    if terminal > MAX_TERMINAL_ALPHA_BAR:
      fail("num_steps", f"the {self.schedule} schedule with T = {self.num_steps} keeps "
           f"alpha_bar_T = {terminal:.3g} of the data in x_T, but sampling starts from N(0, I) "
           f"(at most {MAX_TERMINAL_ALPHA_BAR} allowed): DDPM's linear betas need T near 1,000; "
           "the cosine schedule reaches 0 at any T")
    if not self.lr > 0:
      fail("lr", f"must be positive, got {self.lr}")
    if not 0 <= self.warmup_fraction < 1:
      fail("warmup_fraction", f"must be in [0, 1), got {self.warmup_fraction}")
    try:
      full = denoisers.architecture(self.denoiser, dict(self.architecture))
    except ValueError as e:
      raise SpecError("architecture", str(e)) from None
    object.__setattr__(self, "architecture", tuple(sorted(full.items())))
    options = dict(DATASETS[self.dataset].default_options)
    for key, value in dict(self.dataset_options).items():
      if key not in options:
        fail("dataset_options", f"has {key!r}, which dataset {self.dataset!r} does not take "
             f"(it takes {', '.join(sorted(options))})")
      options[key] = value
    object.__setattr__(self, "dataset_options", tuple(sorted(options.items())))

  @classmethod
  def from_config(cls, prior: ml_collections.ConfigDict | Mapping[str, Any]) -> "PriorSpec":
    """From a config's `prior` group (its `cache_dir` and `data_dir`, if any, are not part of
    the spec: they say where things are, not what they are)."""
    values = prior.to_dict() if isinstance(prior, ml_collections.ConfigDict) else dict(prior)
    values = {k: v for k, v in values.items() if k not in ("cache_dir", "data_dir")}
    known = [f.name for f in dataclasses.fields(cls)]
    for key in values:
      if key not in known:
        raise SpecError(key, f"is not a prior spec key; a prior spec has {', '.join(known)}")
    for key in ("architecture", "dataset_options"):
      values[key] = tuple(dict(values.get(key) or {}).items())
    return cls(**values)

  def to_dict(self) -> dict[str, Any]:
    out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
    out["architecture"] = dict(self.architecture)
    out["dataset_options"] = dict(self.dataset_options)
    return _canonical(out)

  def key(self) -> str:
    """A short hash of the spec and the format version: the cache directory's suffix."""
    text = json.dumps({**self.to_dict(), "format_version": FORMAT_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]

  @property
  def sample_shape(self) -> tuple[int, ...]:
    return tuple(DATASETS[self.dataset].sample_shape(self.size, dict(self.dataset_options)))


class Prior(NamedTuple):
  apply: denoisers.DenoiserApply     # (params, x [B, ...], t [B]) -> output like x
  params: Any                        # the EMA weights
  schedule: schedules.Schedule
  spec: PriorSpec
  source: str                        # "trained", "resumed" or "loaded" (SOURCES)
  train_s: float                     # training time the prior cost, over every call
  call_s: float                      # this call's time (training, or just loading)
  directory: str

  def summary(self) -> dict[str, Any]:
    """What a results file records about the prior it used."""
    return {"source": self.source, "train_s": self.train_s, "key": self.spec.key(),
            "spec": self.spec.to_dict()}


def replicated_on(prior: Prior, mesh: jax.sharding.Mesh) -> Prior:
  """`prior` with its weights and schedule replicated over `mesh`. `load_or_train` leaves them
  replicated over its training mesh (every device); a consumer that splits smaller batches over
  fewer devices places the prior there, so no device computes a batch whole."""
  replicated = parallel.replicated(mesh)
  return prior._replace(params=parallel.put(prior.params, replicated),
                        schedule=parallel.put(prior.schedule, replicated))


def cache_root(cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  if cache_dir:
    return pathlib.Path(cache_dir)
  if os.environ.get(CACHE_ENV):
    return pathlib.Path(os.environ[CACHE_ENV]) / "priors"
  return pathlib.Path.home() / ".cache" / "jaxlab" / "priors"


def directory(spec: PriorSpec, cache_dir: str | os.PathLike | None = None) -> pathlib.Path:
  return cache_root(cache_dir) / f"{spec.dataset}-{spec.key()}"


def make_schedule(spec: PriorSpec) -> schedules.Schedule:
  if spec.schedule == "linear":
    return schedules.linear_schedule(spec.num_steps)
  return schedules.cosine_schedule(spec.num_steps)


def network(spec: PriorSpec, num_labels: int | None = None):
  """(model, apply) of the spec's denoiser; `num_labels` adds the zoo's label embedding (the
  pretrained prior has none; `zoo.unet.add_label_embedding` extends its parameters)."""
  return denoisers.build(spec.denoiser, spec.sample_shape, dict(spec.architecture),
                         num_labels=num_labels)


def ema_decay(step: jax.Array, *, maximum: float, power: float) -> jax.Array:
  return jnp.minimum(maximum, 1.0 - (1.0 + step.astype(jnp.float32)) ** (-power))


def optimizer(spec: PriorSpec) -> optax.GradientTransformation:
  warmup = max(1, round(spec.warmup_fraction * spec.steps))
  lr = optax.warmup_cosine_decay_schedule(0.0, spec.lr, warmup, max(spec.steps, warmup + 1))
  return optax.chain(optax.clip_by_global_norm(spec.grad_clip), optax.adam(lr))


def training_images(spec: PriorSpec, data_dir: str | None = None) -> np.ndarray:
  images = np.asarray(DATASETS[spec.dataset].load(spec.size, dict(spec.dataset_options),
                                                  data_dir), np.float32)
  if images.shape[1:] != spec.sample_shape:
    raise ValueError(f"dataset {spec.dataset!r} gave samples of shape {images.shape[1:]}, "
                     f"expected {spec.sample_shape}")
  return images


def ema_state(params: Any, opt: optax.GradientTransformation) -> dict[str, Any]:
  """A denoiser's training state: its weights, their EMA (starting equal), the optimiser's."""
  return {"params": params, "ema": params, "opt_state": opt.init(params),
          "step": jnp.zeros((), jnp.int32)}


def denoising_step(state: dict[str, Any], x0: jax.Array, t: jax.Array, noise: jax.Array, *,
                   apply: denoisers.DenoiserApply, opt: optax.GradientTransformation,
                   schedule: schedules.Schedule, parameterization: str, ema_max: float,
                   ema_power: float) -> tuple[dict[str, Any], jax.Array]:
  """One regression step on x_t = q_sample(x0, t, noise) towards the parameterization's target,
  then the EMA update; returns (state, loss). Pretraining draws plain noise; fine-tunings may
  pass any noise (e.g. an adversarial mixture)."""
  x_t = schedules.q_sample(schedule, x0, t, noise)
  target = schedules.target_for(schedule, t, x0, noise, parameterization)

  def loss(params):
    return jnp.mean(jnp.square(apply(params, x_t, t) - target))
  value, grads = jax.value_and_grad(loss)(state["params"])
  updates, opt_state = opt.update(grads, state["opt_state"], state["params"])
  params = optax.apply_updates(state["params"], updates)
  decay = ema_decay(state["step"], maximum=ema_max, power=ema_power)
  ema = jax.tree.map(lambda e, p: decay * e + (1.0 - decay) * p, state["ema"], params)
  return {"params": params, "ema": ema, "opt_state": opt_state, "step": state["step"] + 1}, value


def pretraining_experiment(spec: PriorSpec, data_dir: str | None = None
                           ) -> train_loop.Experiment:
  """DDPM pretraining from scratch as an `Experiment` of the shared loop."""
  model, apply = network(spec)
  schedule = make_schedule(spec)
  opt = optimizer(spec)

  def init(rng):
    return ema_state(model.init(rng), opt)

  def update(state, batch, rng):
    x0 = batch["image"]
    t_key, noise_key = jax.random.split(rng)
    t = jax.random.randint(t_key, (x0.shape[0],), 0, schedule.num_steps)
    noise = jax.random.normal(noise_key, x0.shape, x0.dtype)
    state, value = denoising_step(state, x0, t, noise, apply=apply, opt=opt, schedule=schedule,
                                  parameterization=spec.parameterization,
                                  ema_max=spec.ema_max, ema_power=spec.ema_power)
    return state, {"loss": value}

  def train_data(process_index, process_count):
    source = pipeline.InMemorySource({"image": training_images(spec, data_dir)})
    return pipeline.grain_pipeline(source, batch_size=spec.batch_size, seed=spec.seed,
                                   process_index=process_index, process_count=process_count)

  return train_loop.Experiment(init=init, update=update, train_data=train_data)


def check_spec_file(path: pathlib.Path, spec: PriorSpec) -> None:
  """Fails, naming the first key that differs, unless `path` records exactly `spec`."""
  recorded = json.loads(path.read_text())
  wanted = {**spec.to_dict(), "format_version": FORMAT_VERSION}
  for key in sorted(set(recorded) | set(wanted)):
    if recorded.get(key) != wanted.get(key):
      raise ValueError(
          f"{path} records {key} = {recorded.get(key)!r}, but the prior asked for has "
          f"{key} = {wanted.get(key)!r}; this directory holds another prior (delete it, or point "
          "prior.cache_dir elsewhere)")


def load_or_train(spec: PriorSpec, cache_dir: str | os.PathLike | None = None, *,
                  data_dir: str | None = None, progress: bool = True, log_every: int = 100,
                  ckpt_every: int = 500, mesh: Mapping[str, int] | None = None) -> Prior:
  """The prior of `spec`: loaded from the cache, resumed, or trained (see the module doc)."""
  where = directory(spec, cache_dir)
  spec_file = where / "spec.json"
  if spec_file.exists():
    check_spec_file(spec_file, spec)
  else:
    where.mkdir(parents=True, exist_ok=True)
    spec_file.write_text(json.dumps({**spec.to_dict(), "format_version": FORMAT_VERSION},
                                    indent=2, sort_keys=True))
  config = config_lib.base_config(preset="quick", seed=spec.seed)
  config.train.update(dict(steps=spec.steps, batch_size=spec.batch_size, log_every=log_every,
                           ckpt_every=ckpt_every, eval_every=spec.steps, progress=progress))
  if mesh is not None:
    config.mesh.update(dict(mesh))
  run = train_loop.run(pretraining_experiment(spec, data_dir), config, where,
                       desc=f"prior {spec.dataset}-{spec.key()}")
  if run.resumed_from is None:
    source = "trained"
  elif run.resumed_from >= spec.steps:
    source = "loaded"
  else:
    source = "resumed"
  train_s = run.earlier_s if source == "loaded" else run.earlier_s + run.wall_s
  _, apply = network(spec)
  return Prior(apply=apply, params=run.state["ema"], schedule=make_schedule(spec), spec=spec,
               source=source, train_s=float(train_s), call_s=float(run.wall_s),
               directory=str(where))
