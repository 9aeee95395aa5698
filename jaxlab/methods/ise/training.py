"""Training every (regime, variant, seed) replica of the ISE decoder in one compiled chunk.

Each regime's training set is a pool of generated conversations, encoded once per variant; a
replica draws its batches from its (regime, variant) pool with a key that depends only on
(regime, seed), so the variants of one seed see the same conversations in the same order and
start from the same weights: their differences are paired. A chunk is `chunk_steps` AdamW steps
of every replica (`lax.scan` inside `replicas.map_replicas`), run and checkpointed by
`core.replicas.run_chunks`.
Loss: cross-entropy on the assistant tokens (answers and their `<eos>`), as the official recipe.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Sequence

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax

from jaxlab.core import replicas
from jaxlab.methods.ise import model as model_lib
from jaxlab.methods.ise import tasks
from jaxlab.zoo import transformer

PyTree = Any
LAYOUT_FILE = "replicas.json"


@dataclasses.dataclass(frozen=True)
class TrainSpec:
  steps: int
  batch_size: int
  learning_rate: float
  warmup_steps: int = 100
  grad_clip: float = 1.0
  weight_decay: float = 0.01
  chunk_steps: int = 100
  ckpt_every: int = 500

  def __post_init__(self):
    if self.steps < 1 or self.batch_size < 1 or self.chunk_steps < 1:
      raise ValueError("train.steps, batch_size and chunk_steps must be >= 1")
    if not self.learning_rate > 0:
      raise ValueError(f"train.learning_rate must be > 0, got {self.learning_rate}")
    if self.ckpt_every % self.chunk_steps:
      raise ValueError(f"train.ckpt_every ({self.ckpt_every}) must be a multiple of "
                       f"train.chunk_steps ({self.chunk_steps})")


@dataclasses.dataclass(frozen=True)
class Replica:
  regime: str
  variant: str
  seed: int


def layout(regimes: Sequence[str], variants: Sequence[str], seeds: Sequence[int]
           ) -> list[Replica]:
  return [Replica(g, v, s) for g in regimes for v in variants for s in seeds]


def optimizer(spec: TrainSpec) -> optax.GradientTransformation:
  """AdamW, linear warm-up then cosine decay to 0, global-norm clipping (the official recipe's
  shape; its lr 2e-5 is for fine-tuning an 8B model, ours trains from scratch)."""
  warmup = min(spec.warmup_steps, spec.steps // 2)
  schedule = optax.warmup_cosine_decay_schedule(0.0, spec.learning_rate, warmup,
                                                max(spec.steps, warmup + 1))
  return optax.chain(optax.clip_by_global_norm(spec.grad_clip),
                     optax.adamw(schedule, weight_decay=spec.weight_decay))


def masked_loss(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array
                ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """Mean next-token cross-entropy over `loss_mask` (position p predicts token p + 1)."""
  targets = jnp.roll(tokens, -1, axis=-1)
  ce = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), targets)
  weight = loss_mask.astype(jnp.float32)
  count = jnp.maximum(weight.sum(), 1.0)
  accuracy = ((jnp.argmax(logits, -1) == targets) * weight).sum() / count
  return (ce * weight).sum() / count, {"token_accuracy": accuracy}


@dataclasses.dataclass(frozen=True)
class Pools:
  """Packed training rows, one set per (regime, variant): [U, R, L] arrays; `index` maps a
  replica to its set. Each row holds several whole conversations one after another: `docs`
  numbers them (0: padding), `positions` restart at each, and attention stays inside one
  (`packed_mask`). The same conversations share a row in every variant of a regime."""
  tokens: np.ndarray
  segments: np.ndarray
  loss_mask: np.ndarray
  positions: np.ndarray
  docs: np.ndarray
  keys: tuple[tuple[str, str], ...]

  def index(self, replica: Replica) -> int:
    return self.keys.index((replica.regime, replica.variant))

  def arrays(self) -> tuple[np.ndarray, ...]:
    return (self.tokens, self.segments, self.loss_mask, self.positions, self.docs)


def _lengths(batch: tasks.Batch) -> np.ndarray:
  return (batch.tokens != tasks.PAD).sum(axis=1)


def pack_groups(lengths: np.ndarray, row_length: int) -> list[list[int]]:
  """Consecutive conversations grouped greedily into rows of at most `row_length` tokens."""
  groups, current, used = [], [], 0
  for index, length in enumerate(lengths):
    if current and used + length > row_length:
      groups.append(current)
      current, used = [], 0
    current.append(index)
    used += int(length)
  if current:
    groups.append(current)
  return groups


def pack(batch: tasks.Batch, groups: Sequence[Sequence[int]], row_length: int
         ) -> tuple[np.ndarray, ...]:
  """(tokens, segments, loss_mask, positions, docs) [len(groups), row_length] of `batch`'s
  conversations laid end to end, one group per row."""
  shape = (len(groups), row_length)
  tokens = np.full(shape, tasks.PAD, np.int32)
  segments = np.full(shape, tasks.ASSISTANT_SEGMENT, np.int32)
  loss_mask = np.zeros(shape, bool)
  positions = np.zeros(shape, np.int32)
  docs = np.zeros(shape, np.int32)
  lengths = _lengths(batch)
  for row, group in enumerate(groups):
    at = 0
    for doc, index in enumerate(group, start=1):
      n = int(lengths[index])
      if at + n > row_length:
        raise ValueError(f"a group of {sum(int(lengths[i]) for i in group)} tokens does not fit "
                         f"a row of {row_length}")
      tokens[row, at:at + n] = batch.tokens[index, :n]
      segments[row, at:at + n] = batch.segments[index, :n]
      # A conversation's last token (<eos>) predicts nothing, so no loss crosses into the next.
      loss_mask[row, at:at + n] = batch.loss_mask[index, :n]
      positions[row, at:at + n] = np.arange(n)
      docs[row, at:at + n] = doc
      at += n
  return tokens, segments, loss_mask, positions, docs


def packed_mask(docs: jax.Array) -> jax.Array:
  """[B, L] conversation numbers -> [B, L, L]: causal and within one conversation."""
  chex.assert_rank(docs, 2)
  length = docs.shape[-1]
  causal = jnp.tril(jnp.ones((length, length), bool))
  return causal[None] & (docs[:, :, None] == docs[:, None, :])


def build_pools(regimes: Sequence[str], variants: Sequence[str], *, size: int, max_turns: int,
                seed: int) -> Pools:
  """`size` generated training conversations per regime, encoded under every variant and
  packed into rows of `tasks.MAX_TOKENS` tokens. A conversation averages well under half a row,
  so packing trains on 2-3 conversations per row for the cost of one. The grouping comes from
  the longest encoding (with delimiters), so every variant packs the same conversations in the
  same rows."""
  keys, packed = [], []
  for index, regime in enumerate(regimes):
    conversations = tasks.conversations(
        seed * 1000 + index, size,
        functools.partial(tasks.training_conversation, regime=regime, max_turns=max_turns))
    batches = {variant: tasks.encode_batch(conversations, variant) for variant in variants}
    longest = np.max([_lengths(b) for b in batches.values()], axis=0)
    groups = pack_groups(longest, tasks.MAX_TOKENS)
    for variant in variants:
      keys.append((regime, variant))
      packed.append(pack(batches[variant], groups, tasks.MAX_TOKENS))
  rows = max(p[0].shape[0] for p in packed)
  # Regimes may pack into different row counts: pad with empty rows (no loss) to one count.
  padded = [[np.concatenate([a, np.zeros((rows - a.shape[0],) + a.shape[1:], a.dtype)])
             for a in p] for p in packed]
  stacked = [np.stack([p[i] for p in padded]) for i in range(5)]
  return Pools(*stacked, keys=tuple(keys))


@functools.lru_cache(maxsize=None)
def _functions(model_spec: model_lib.ModelSpec, train_spec: TrainSpec,
               sharding: jax.sharding.Sharding | None):
  net = model_lib.network(model_spec)
  tx = optimizer(train_spec)

  def init_one(key):
    params = net.init(jax.random.fold_in(key, 0))
    return {"params": params, "opt_state": tx.init(params)}

  def loss_fn(params, tokens, segments, loss_mask, positions, docs, use_segments):
    logits = net.apply(params, tokens, segments, use_segments, positions=positions,
                       mask=packed_mask(docs))
    return masked_loss(logits, tokens, loss_mask)

  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def one_replica(state, key, pool_index, use_segments, pools, start, stop):
    def step(state, index):
      rows = jax.random.randint(jax.random.fold_in(jax.random.fold_in(key, 1), index),
                                (train_spec.batch_size,), 0, pools[0].shape[1])
      batch = [a[pool_index, rows] for a in pools]
      (loss, metrics), grads = grad_fn(state["params"], *batch, use_segments)
      updates, opt_state = tx.update(grads, state["opt_state"], state["params"])
      return {"params": optax.apply_updates(state["params"], updates),
              "opt_state": opt_state}, {"loss": loss, **metrics}

    state, metrics = replicas.scan_chunk(step, state, start, stop, train_spec.chunk_steps)
    return state, {f"train/{k}": v for k, v in metrics.items()}

  init = jax.jit(jax.vmap(init_one))
  chunk = jax.jit(replicas.map_replicas(one_replica, in_axes=(0, 0, 0, 0, None, None, None)),
                  donate_argnums=0, out_shardings=(sharding, None) if sharding else None)
  return net, init, chunk


@dataclasses.dataclass
class FitResult:
  params: PyTree                  # replica-stacked final parameters
  history: list[dict[str, Any]]
  wall_s: float
  earlier_s: float


def replica_inputs(replicas_: Sequence[Replica], pools: Pools, regimes: Sequence[str]):
  """(keys [R], pool index [R], use_segments [R]) of a layout. The key depends on (regime,
  seed) only: the variants of a seed share their initial weights and batch order."""
  keys = jnp.stack([jax.random.fold_in(jax.random.key(r.seed), regimes.index(r.regime))
                    for r in replicas_])
  pool_index = jnp.asarray([pools.index(r) for r in replicas_], jnp.int32)
  use_segments = jnp.asarray([float(tasks.USES_SEGMENTS[r.variant]) for r in replicas_])
  return keys, pool_index, use_segments


def fit(model_spec: model_lib.ModelSpec, train_spec: TrainSpec, replicas_: Sequence[Replica],
        pools: Pools, *, mesh: jax.sharding.Mesh, workdir: str | os.PathLike | None = None,
        progress: bool = True, desc: str = "ise") -> FitResult:
  """Trains every replica for `train_spec.steps` steps (resuming from `workdir`)."""
  regimes = sorted({r.regime for r in replicas_}, key=tasks.REGIMES.index)
  keys, pool_index, use_segments = replica_inputs(replicas_, pools, regimes)
  sharding = replicas.replica_sharding(len(replicas_), mesh)
  _, init, chunk = _functions(model_spec, train_spec, sharding)
  if workdir is not None:
    write_layout(workdir, model_spec, train_spec, replicas_)
  keys, pool_index, use_segments = (replicas.place(a, mesh)
                                    for a in (keys, pool_index, use_segments))
  pool_arrays = tuple(jnp.asarray(a) for a in pools.arrays())
  run = replicas.run_chunks(
      lambda: init(keys),
      lambda state, start, stop: chunk(state, keys, pool_index, use_segments, pool_arrays,
                                       start, stop),
      steps=train_spec.steps, chunk_steps=train_spec.chunk_steps,
      ckpt_every=train_spec.ckpt_every, mesh=mesh, workdir=workdir, desc=desc,
      progress=progress)
  return FitResult(params=run.state["params"], history=run.history, wall_s=run.wall_s,
                   earlier_s=run.earlier_s)


def write_layout(workdir: str | os.PathLike, model_spec: model_lib.ModelSpec,
                 train_spec: TrainSpec, replicas_: Sequence[Replica]) -> None:
  """What `evaluation.evaluate_examples` needs to rebuild and restore the replicas."""
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, LAYOUT_FILE), "w", encoding="utf-8") as f:
    json.dump({"model": dataclasses.asdict(model_spec), "train": dataclasses.asdict(train_spec),
               "replicas": [dataclasses.asdict(r) for r in replicas_]}, f, indent=1)


def read_layout(workdir: str | os.PathLike
                ) -> tuple[model_lib.ModelSpec, TrainSpec, list[Replica]]:
  path = os.path.join(workdir, LAYOUT_FILE)
  if not os.path.exists(path):
    raise FileNotFoundError(f"{path} is missing: train in this workdir first "
                            "(python -m experiments.ise)")
  with open(path, encoding="utf-8") as f:
    found = json.load(f)
  return (model_lib.ModelSpec(**found["model"]), TrainSpec(**found["train"]),
          [Replica(**r) for r in found["replicas"]])


# -------------------------------------------------------------------------------------------
# Evaluation: greedy answers, exact match.

ANSWER_SLOTS = tasks.MAX_ANSWER_TOKENS + 1   # the answer and its <eos>


@dataclasses.dataclass(frozen=True)
class EvalSet:
  """Prompts [N, L] padded, their lengths, and answer slots [N, ANSWER_SLOTS] (ids then PAD;
  -1 where no answer is wanted, e.g. an attacker's target on a clean prompt)."""
  tokens: np.ndarray
  segments: np.ndarray
  prompt_len: np.ndarray
  target: np.ndarray
  attacker_target: np.ndarray


def _answer_slots(answer: str | None) -> np.ndarray:
  slots = np.full((ANSWER_SLOTS,), tasks.PAD, np.int32)
  if answer is None:
    slots[:] = -1
    return slots
  ids = tasks.answer_ids(answer)
  slots[:len(ids)] = ids
  return slots


def eval_set(conversations: Sequence[tasks.Conversation], variant: str,
             forged_segment: int | None = None) -> EvalSet:
  """Prompts of `conversations` under `variant`; with `forged_segment`, every injected token
  is given that segment instead of the data's (what ISE relies on)."""
  n = len(conversations)
  tokens = np.full((n, tasks.MAX_TOKENS), tasks.PAD, np.int32)
  segments = np.full((n, tasks.MAX_TOKENS), tasks.ASSISTANT_SEGMENT, np.int32)
  prompt_len = np.zeros((n,), np.int32)
  for row, conversation in enumerate(conversations):
    ids, segs = tasks.encode(conversation.messages, variant)
    if forged_segment is not None:
      for position in tasks.injected_positions(conversation, variant):
        segs[position] = forged_segment
    tokens[row, :len(ids)] = ids
    segments[row, :len(ids)] = segs
    prompt_len[row] = len(ids)
  return EvalSet(tokens=tokens, segments=segments, prompt_len=prompt_len,
                 target=np.stack([_answer_slots(c.target) for c in conversations]),
                 attacker_target=np.stack([_answer_slots(c.attacker_target)
                                           for c in conversations]))


def answers_match(generated: jax.Array, slots: jax.Array) -> jax.Array:
  """[N] exact match of generated answer slots against wanted ones (up to and including the
  wanted `<eos>`); False where nothing is wanted (-1)."""
  wanted = slots >= 0
  eos_at = jnp.argmax(slots == tasks.EOS, axis=-1)
  upto = jnp.arange(slots.shape[-1])[None] <= eos_at[:, None]
  same = (generated == slots) | ~upto
  return jnp.all(same, axis=-1) & wanted[:, 0]


@functools.lru_cache(maxsize=None)
def generate_function(model_spec: model_lib.ModelSpec):
  """jit((params, use_segments, tokens, segments, prompt_len) -> answer slots [N, A]) for one
  replica."""
  net = model_lib.network(model_spec)

  def generate(params, use_segments, tokens, segments, prompt_len):
    logits_fn = lambda t, s: net.apply(params, t, s, use_segments)
    out, _ = transformer.greedy_generate(logits_fn, tokens, segments, prompt_len, ANSWER_SLOTS,
                                         new_segment=tasks.ASSISTANT_SEGMENT)
    where = jnp.clip(prompt_len[:, None] + jnp.arange(ANSWER_SLOTS)[None], 0,
                     tokens.shape[1] - 1)
    return jnp.take_along_axis(out, where, axis=1)

  return jax.jit(generate)


def score(model_spec: model_lib.ModelSpec, params: PyTree, use_segments: float,
          data: EvalSet) -> dict[str, np.ndarray]:
  """{"correct": [N] bool, "attacked": [N] bool (answer equals the attacker's), "answers"}."""
  generated = generate_function(model_spec)(params, jnp.asarray(use_segments, jnp.float32),
                                            jnp.asarray(data.tokens), jnp.asarray(data.segments),
                                            jnp.asarray(data.prompt_len))
  return {"correct": np.asarray(answers_match(generated, jnp.asarray(data.target))),
          "attacked": np.asarray(answers_match(generated, jnp.asarray(data.attacker_target))),
          "answers": np.asarray(generated)}
