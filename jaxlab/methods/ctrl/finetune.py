"""CTRL's fine-tuning: a pretrained diffusion model made conditional by KL-regularised RL.

The policy is the pretrained denoiser with a label input (a zero-initialised label embedding;
`zoo.unet.add_label_embedding`) and, with `finetune="lora"`, low-rank adapters on its kernels
(`zoo.lora`, B = 0 at init), so that at initialisation it is exactly the pretrained model. Each
update draws labels y uniformly, samples x0 with the policy's DDIM chain (eta = 1, every step
noisy; `diffusion.sampling.ddim_sample_with_kl`) together with each step's KL to the frozen
pretrained chain from the same x_t, and minimises

    loss = -mean_b log(p(y_b | x0_b) + 1e-6) + alpha * mean_b sum_t KL_t(b)

by back-propagating through the sampler (reparameterised; `jax.checkpoint` per step with
`remat`). With the KL summed over dimensions and steps and alpha = 1, the optimum's terminal law
is p_pre(x) p(y | x) (in general p_pre p^(1/alpha)). `kl_reduction="mean"` averages the KL over
dimensions instead and weights the two terms as the official code does (`loss_coeff` on the
reward, `kl_weight` on the KL: alpha = kl_weight / (loss_coeff D), nearly reward-only).

Truncated back-propagation (`truncation`): "none"; "per_step", the official scheme, K ~ U{0..K_max}
redrawn at every update with the first K sampling steps cut from the gradient; "once", one K drawn
for the whole run. The null label's embedding row (the last one) gets no gradient.

Every update of every seed runs inside one jitted function (a `lax.scan` over a chunk of updates,
vmapped over seeds) that compiles once; Python only runs between chunks (`core.replicas`).
"""
from __future__ import annotations

import dataclasses
import math
import os
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import parallel
from jaxlab.core import replicas
from jaxlab.diffusion import sampling
from jaxlab.diffusion import schedules
from jaxlab.zoo import lora

PyTree = Any
# (params, x [B, ...], t [B], label [B]) -> denoiser output like x
PolicyApply = Callable[..., jax.Array]
# (params, x [B, ...], t [B]) -> denoiser output like x
ReferenceApply = Callable[..., jax.Array]
# (x0 [B, ...], y [B]) -> log p(y | x0) [B]
LogReward = Callable[[jax.Array, jax.Array], jax.Array]

FINETUNE_MODES = ("lora", "full")
KL_REDUCTIONS = ("sum", "mean")
TRUNCATIONS = ("none", "per_step", "once")
# "constant": the official code's fixed learning rates; "cosine": both decay to 0 over `steps`.
LR_SCHEDULES = ("constant", "cosine")
REWARD_FLOOR = 1e-6
EMBEDDING = "label_embedding"


@dataclasses.dataclass(frozen=True)
class Settings:
  """CTRL's settings; the defaults are the method's (see the README for the official ones)."""
  num_labels: int
  steps: int = 500                  # RL updates
  batch_size: int = 64
  sample_steps: int = 25            # DDIM steps of the policy's chain
  eta: float = 1.0
  parameterization: str = "eps"
  alpha: float = 1.0
  kl_reduction: str = "sum"
  loss_coeff: float = 0.1           # kl_reduction="mean" only
  kl_weight: float = 0.01           # kl_reduction="mean" only
  finetune: str = "lora"
  lora_rank: int = 4
  lora_scale: float = 1.0           # LoRA alpha / rank
  lora_lr: float = 1e-3
  embedding_lr: float = 1e-2
  full_lr: float = 1e-4
  lr_schedule: str = "constant"
  weight_decay: float = 0.1
  grad_clip: float = 5.0
  truncation: str = "none"
  max_truncation: int | None = None   # K_max (None: sample_steps)
  # Below this timestep the policy is the pretrained denoiser (0: it acts at every step). The
  # last DDIM steps are nearly noiseless (sigma = 0.010 into t = 0 on T = 1,000), so any change
  # there costs 1 / (2 sigma^2) nats per unit squared while the reward's gradient is largest
  # there; left free, the digits policy spends its KL there and never learns (README).
  policy_min_t: int = 0
  remat: bool = True
  unroll: int = 1
  # The denoisers get each chain step's t as a scalar (every row shares it), so that the zoo's
  # ResidualMLP runs its time and label path once per step and label rather than once per row
  # (the same numbers; a digits update 0.47 -> 0.40 s). False for a denoiser that needs t [B].
  shared_time: bool = True
  num_seeds: int = 1
  chunk_steps: int = 50
  ckpt_every: int = 250

  def __post_init__(self):
    def require(ok, key, message):
      if not ok:
        raise ValueError(f"ctrl setting {key} {message}")
    require(self.alpha > 0, "alpha", f"must be > 0 (the KL weight), got {self.alpha}")
    require(self.num_labels >= 1, "num_labels", f"must be >= 1, got {self.num_labels}")
    for key in ("steps", "batch_size", "sample_steps", "lora_rank", "num_seeds", "chunk_steps",
                "ckpt_every"):
      require(getattr(self, key) >= 1, key, f"must be >= 1, got {getattr(self, key)}")
    require(self.eta > 0, "eta", f"must be > 0 (a noiseless step has no KL), got {self.eta}")
    require(self.kl_reduction in KL_REDUCTIONS, "kl_reduction",
            f"must be one of {KL_REDUCTIONS}, got {self.kl_reduction!r}")
    require(self.finetune in FINETUNE_MODES, "finetune",
            f"must be one of {FINETUNE_MODES}, got {self.finetune!r}")
    require(self.truncation in TRUNCATIONS, "truncation",
            f"must be one of {TRUNCATIONS}, got {self.truncation!r}")
    require(self.lr_schedule in LR_SCHEDULES, "lr_schedule",
            f"must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
    require(self.parameterization in schedules.PARAMETERIZATIONS, "parameterization",
            f"must be one of {schedules.PARAMETERIZATIONS}, got {self.parameterization!r}")
    require(self.max_truncation is None or 0 <= self.max_truncation <= self.sample_steps,
            "max_truncation", f"must be in [0, sample_steps = {self.sample_steps}], got "
            f"{self.max_truncation}")
    require(self.policy_min_t >= 0, "policy_min_t", f"must be >= 0, got {self.policy_min_t}")
    require(self.ckpt_every % self.chunk_steps == 0, "ckpt_every",
            f"must be a multiple of chunk_steps = {self.chunk_steps}, got {self.ckpt_every}")

  @classmethod
  def from_config(cls, group: ml_collections.ConfigDict | Mapping[str, Any],
                  **overrides: Any) -> "Settings":
    values = group.to_dict() if isinstance(group, ml_collections.ConfigDict) else dict(group)
    values.update(overrides)
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
      raise ValueError(f"unknown ctrl setting(s) {unknown}; known: {', '.join(sorted(known))}")
    return cls(**values)

  def kl_scale(self, sample_dims: int) -> float:
    """The weight of sum_t sum_d KL relative to -log p: alpha, or the official weighting."""
    if self.kl_reduction == "sum":
      return self.alpha
    return self.kl_weight / (self.loss_coeff * sample_dims)


# ---------------------------------------------------------------------------------------------
# What is trained, and the policy's parameters from it.


def trainable_init(policy_params: PyTree, settings: Settings, key: jax.Array) -> PyTree:
  """The trained variables: {"lora": adapters, "embedding": table} (lora) or {"params": all}."""
  if settings.finetune == "full":
    return {"params": policy_params}
  # cap_rank: a low-dimensional sample's input and output layers are thinner than the rank.
  trained = {"lora": lora.init(_without_embedding(policy_params), settings.lora_rank, key,
                               cap_rank=True)}
  if EMBEDDING in policy_params:
    trained["embedding"] = policy_params[EMBEDDING]["embedding"]
  return trained


def _without_embedding(params: PyTree) -> PyTree:
  return {k: v for k, v in params.items() if k != EMBEDDING} if isinstance(params, dict) else params


def merged_params(trained: PyTree, policy_params: PyTree, settings: Settings) -> PyTree:
  """The policy's parameters: the base with the adapters merged and the trained label table."""
  if settings.finetune == "full":
    return trained["params"]
  merged = lora.merge(_without_embedding(policy_params), trained["lora"], settings.lora_scale)
  if "embedding" in trained:
    merged = dict(merged, **{EMBEDDING: {"embedding": trained["embedding"]}})
  return merged


def _labels_of(trained: PyTree) -> PyTree:
  """Optimiser group of every trained leaf: the label table's learning rate or the rest's."""
  def label(path, _):
    names = [str(getattr(k, "key", k)) for k in path]
    return "embedding" if ("embedding" in names[:1] or EMBEDDING in names) else "weights"
  return jax.tree_util.tree_map_with_path(label, trained)


def learning_rate(settings: Settings, peak: float) -> optax.ScalarOrSchedule:
  if settings.lr_schedule == "cosine":
    return optax.cosine_decay_schedule(peak, settings.steps)
  return peak


def optimizer(settings: Settings, trained: PyTree) -> optax.GradientTransformation:
  weights_lr = settings.lora_lr if settings.finetune == "lora" else settings.full_lr
  return optax.chain(
      optax.clip_by_global_norm(settings.grad_clip),
      optax.multi_transform(
          {"weights": optax.adamw(learning_rate(settings, weights_lr),
                                  weight_decay=settings.weight_decay),
           "embedding": optax.adamw(learning_rate(settings, settings.embedding_lr),
                                    weight_decay=settings.weight_decay)},
          _labels_of(trained)))


def _zero_null_row(grads: PyTree, settings: Settings) -> PyTree:
  """No gradient for the null label's row (the last), which stands for "no condition"."""
  if settings.finetune == "full":
    params = grads["params"]
    if isinstance(params, dict) and EMBEDDING in params:
      table = params[EMBEDDING]["embedding"]
      params = dict(params, **{EMBEDDING: {"embedding": table.at[-1].set(0.0)}})
      return {"params": params}
    return grads
  if "embedding" in grads:
    return dict(grads, embedding=grads["embedding"].at[-1].set(0.0))
  return grads


# ---------------------------------------------------------------------------------------------
# Sampling and the objective.


def gradient_mask(settings: Settings, key: jax.Array, fixed_k: jax.Array | None = None
                  ) -> jax.Array | None:
  """bool [K] of the steps back-propagated through (None: all)."""
  if settings.truncation == "none":
    return None
  k_max = settings.sample_steps if settings.max_truncation is None else settings.max_truncation
  cut = (fixed_k if settings.truncation == "once"
         else jax.random.randint(key, (), 0, k_max + 1))
  return jnp.arange(settings.sample_steps) >= cut


def policy_denoiser(policy_apply: PolicyApply, params: PyTree, reference_apply: ReferenceApply,
                    reference_params: PyTree, labels: jax.Array, settings: Settings
                    ) -> Callable[[jax.Array, jax.Array], jax.Array]:
  """(x_t, t) -> the tuned policy's denoiser output: the policy's at t >= policy_min_t, the
  pretrained model's below (the same chain in training and at sampling time)."""
  def denoise(x, t):
    tuned = policy_apply(params, x, t, labels)
    if settings.policy_min_t <= 0:
      return tuned
    acting = (t >= settings.policy_min_t).reshape((-1,) + (1,) * (x.ndim - 1))
    return jnp.where(acting, tuned, reference_apply(reference_params, x, t))
  return denoise


def sample_with_kl(policy_apply: PolicyApply, params: PyTree, reference_apply: ReferenceApply,
                   reference_params: PyTree, schedule: schedules.Schedule, labels: jax.Array,
                   key: jax.Array, settings: Settings, sample_shape: tuple[int, ...], *,
                   grad_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
  """(x0 [B, ...], kl [K, B]) of the policy's chain for `labels`, against the reference's."""
  noise_key, steps_key = jax.random.split(key)
  x_T = jax.random.normal(noise_key, (labels.shape[0], *sample_shape))
  keys = jax.random.split(steps_key, settings.sample_steps)
  return sampling.ddim_sample_with_kl(
      policy_denoiser(policy_apply, params, reference_apply, reference_params, labels, settings),
      lambda x, t: reference_apply(reference_params, x, t), schedule, x_T, keys,
      num_steps=settings.sample_steps, eta=settings.eta,
      parameterization=settings.parameterization, remat=settings.remat,
      unroll=settings.unroll, grad_mask=grad_mask, shared_time=settings.shared_time)


def sample(policy_apply: PolicyApply, params: PyTree, reference_apply: ReferenceApply,
           reference_params: PyTree, schedule: schedules.Schedule, labels: jax.Array,
           key: jax.Array, settings: Settings, sample_shape: tuple[int, ...]) -> jax.Array:
  """Samples x0 [B, ...] of the tuned policy (its chain as trained) for `labels` [B]."""
  x0, _ = sample_with_kl(policy_apply, params, reference_apply, reference_params, schedule,
                         labels, key, settings, sample_shape)
  return x0


def floored_reward(log_reward_values: jax.Array) -> jax.Array:
  """The reward CTRL maximises: log(p(y | x0) + 1e-6), from log p(y | x0)."""
  return jnp.logaddexp(log_reward_values, math.log(REWARD_FLOOR))


def objective(settings: Settings, sample_dims: int, log_reward_values: jax.Array,
              kl: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
  """(loss, metrics) from log p(y | x0) [B] and the per-step KL [K, B]."""
  reward = floored_reward(log_reward_values)
  kl_total = jnp.sum(kl, axis=0)                                       # [B]
  if settings.kl_reduction == "sum":
    loss = -jnp.mean(reward) + settings.alpha * jnp.mean(kl_total)
  else:
    loss = (-settings.loss_coeff * jnp.mean(reward)
            + settings.kl_weight * jnp.mean(kl_total) / sample_dims)
  return loss, {"train/loss": loss, "train/reward": jnp.mean(reward),
                "train/kl": jnp.mean(kl_total),
                "train/mean_p_label": jnp.mean(jnp.exp(log_reward_values))}


# ---------------------------------------------------------------------------------------------
# The training loop.


@dataclasses.dataclass
class FinetuneResult:
  trained: PyTree            # seed-stacked trained variables ([S, ...] leaves)
  params: list[PyTree]       # the policy's merged parameters, one per seed
  history: list[dict[str, Any]]
  wall_s: float
  earlier_s: float


def finetune(policy_apply: PolicyApply, policy_params: PyTree, reference_apply: ReferenceApply,
             reference_params: PyTree, schedule: schedules.Schedule, log_reward: LogReward,
             config: Settings | ml_collections.ConfigDict | Mapping[str, Any], key: jax.Array,
             *, sample_shape: tuple[int, ...], workdir: str | os.PathLike | None = None,
             progress: bool = True, desc: str = "ctrl") -> FinetuneResult:
  """CTRL-fine-tunes `policy_params` (the pretrained params with a label table) for every seed.

  `log_reward(x0, y)` is log p(y | x0) (a temperature-scaled classifier). Resumes from
  `workdir/checkpoints` when given. Returns every seed's trained variables and merged params.
  """
  settings = config if isinstance(config, Settings) else Settings.from_config(config)
  sample_dims = int(np.prod(sample_shape))
  seed_keys = jax.random.split(key, settings.num_seeds)
  run = _training_functions(policy_apply, reference_apply, log_reward, settings,
                            tuple(sample_shape), sample_dims)
  init_fn, chunk_fn = run
  mesh = parallel.make_mesh()
  result = replicas.run_chunks(
      lambda: init_fn(policy_params, seed_keys),
      lambda state, start, stop: chunk_fn(state, policy_params, reference_params, schedule,
                                          start, stop),
      steps=settings.steps, chunk_steps=settings.chunk_steps, ckpt_every=settings.ckpt_every,
      mesh=mesh, workdir=workdir, desc=desc, progress=progress)
  trained = result.state["trained"]
  params = [merged_params(replicas.take(trained, s), policy_params, settings)
            for s in range(settings.num_seeds)]
  return FinetuneResult(trained=trained, params=params, history=result.history,
                        wall_s=result.wall_s, earlier_s=result.earlier_s)


def _training_functions(policy_apply, reference_apply, log_reward, settings, sample_shape,
                        sample_dims):
  """(init(policy_params, seed_keys), chunk(state, policy_params, reference_params, schedule,
  start, stop)), both jitted; the chunk is vmapped over seeds and compiles once."""

  def init_one(policy_params, key):
    lora_key, train_key, cut_key = jax.random.split(key, 3)
    trained = trainable_init(policy_params, settings, lora_key)
    k_max = settings.sample_steps if settings.max_truncation is None else settings.max_truncation
    # Raw key data (uint32), not a typed key: the state is checkpointed.
    return {"trained": trained, "opt_state": optimizer(settings, trained).init(trained),
            "key": jax.random.key_data(train_key),
            "fixed_k": jax.random.randint(cut_key, (), 0, k_max + 1)}

  def loss_fn(trained, policy_params, reference_params, schedule, key, fixed_k):
    label_key, sample_key, mask_key = jax.random.split(key, 3)
    labels = jax.random.randint(label_key, (settings.batch_size,), 0, settings.num_labels)
    params = merged_params(trained, policy_params, settings)
    x0, kl = sample_with_kl(policy_apply, params, reference_apply, reference_params, schedule,
                            labels, sample_key, settings, sample_shape,
                            grad_mask=gradient_mask(settings, mask_key, fixed_k))
    return objective(settings, sample_dims, log_reward(x0, labels), kl)

  def update_one(state, policy_params, reference_params, schedule, step):
    key = jax.random.fold_in(jax.random.wrap_key_data(state["key"]), step)
    grads, metrics = jax.grad(loss_fn, has_aux=True)(state["trained"], policy_params,
                                                      reference_params, schedule, key,
                                                      state["fixed_k"])
    grads = _zero_null_row(grads, settings)
    opt = optimizer(settings, state["trained"])
    updates, opt_state = opt.update(grads, state["opt_state"], state["trained"])
    new = dict(state, trained=optax.apply_updates(state["trained"], updates),
               opt_state=opt_state)
    return new, metrics

  def chunk_one(state, policy_params, reference_params, schedule, start, stop):
    step = lambda s, i: update_one(s, policy_params, reference_params, schedule, i)
    return replicas.scan_chunk(step, state, start, stop, settings.chunk_steps)

  init = jax.jit(jax.vmap(init_one, in_axes=(None, 0)))
  chunk = jax.jit(jax.vmap(chunk_one, in_axes=(0, None, None, None, None, None)),
                  donate_argnums=0)
  return init, chunk


def kl_at_init(policy_apply: PolicyApply, policy_params: PyTree, reference_apply: ReferenceApply,
               reference_params: PyTree, schedule: schedules.Schedule, settings: Settings,
               key: jax.Array, sample_shape: tuple[int, ...]) -> jax.Array:
  """The policy's summed KL to the reference before any update (0 for a correct init)."""
  trained = trainable_init(policy_params, settings, key)
  labels = jnp.arange(settings.batch_size) % settings.num_labels
  _, kl = sample_with_kl(policy_apply, merged_params(trained, policy_params, settings),
                         reference_apply, reference_params, schedule, labels, key, settings,
                         sample_shape)
  return jnp.max(jnp.sum(kl, axis=0))

