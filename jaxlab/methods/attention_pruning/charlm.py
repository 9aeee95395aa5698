"""The character language model whose attention is pruned, its training run and its scoring.

A zoo `sequence.Backbone` (one-hot read-in, learned positions, softmax-attention blocks with an
MLP, no q/k/v biases so each head's logits are exactly X W_Q,h W_K,h^T X^T / sqrt(d_h)) trained
on the Python Language Reference topics (`jaxlab.data.python_docs`) with `core.train_loop`
(resumable). Pruned models are scored by passing replaced query/key matrices to the backbone
(`query_keys`), never by editing the trained parameters.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from jaxlab.core import config as config_lib
from jaxlab.core import train_loop
from jaxlab.data import pipeline
from jaxlab.data import python_docs
from jaxlab.methods.attention_pruning import pruning
from jaxlab.zoo import functional
from jaxlab.zoo import sequence

PyTree = Any
# Windows are drawn from a virtual stream of example indices (start = a hash of the index), so
# the grain pipeline checkpoints the position and a resumed run sees the same windows.
STREAM_LENGTH = 2**31 - 1
_HASH_MULTIPLIER = 2_654_435_761


def make_model(config: ml_collections.ConfigDict, vocab_size: int) -> functional.Functional:
  m = config.model
  config_lib.require(m.width % m.num_heads == 0, "model.num_heads",
                     f"width {m.width} is not divisible by {m.num_heads} heads")
  return functional.Functional(lambda rngs: sequence.Backbone(
      d_in=vocab_size, d_out=vocab_size, width=m.width, depth=m.depth,
      max_len=config.data.seq_len, mixer="softmax_attention", num_heads=m.num_heads,
      causal=True, use_mlp=True, qkv_bias=False, rngs=rngs))


def one_hot_inputs(window: jax.Array, vocab_size: int) -> jax.Array:
  return jax.nn.one_hot(window[..., :-1], vocab_size, dtype=jnp.float32)


def token_losses(model: functional.Functional, params: PyTree, window: jax.Array,
                 vocab_size: int, query_keys: Sequence[Any] | None = None) -> jax.Array:
  """Next-character cross-entropy in nats, [B, L], under optional replaced query/keys."""
  logits = model.apply(params, one_hot_inputs(window, vocab_size), query_keys=query_keys)
  return optax.softmax_cross_entropy_with_integer_labels(logits, window[..., 1:])


def window_starts(example: np.ndarray, num_chars: int, seq_len: int, seed: int) -> np.ndarray:
  mixed = (np.asarray(example, np.uint64) * np.uint64(_HASH_MULTIPLIER)
           + np.uint64(seed)) % np.uint64(2**32)
  return (mixed % np.uint64(num_chars - seq_len - 1)).astype(np.int64)


def make_experiment(config: ml_collections.ConfigDict,
                    corpus: python_docs.CharCorpus) -> train_loop.Experiment:
  model = make_model(config, corpus.vocab_size)
  optim = config.optim
  schedule = optax.warmup_cosine_decay_schedule(0.0, optim.learning_rate, optim.warmup_steps,
                                                max(config.train.steps, optim.warmup_steps + 1))
  transform = optax.chain(optax.clip_by_global_norm(optim.grad_clip),
                          optax.adamw(schedule, weight_decay=optim.weight_decay))
  vocab, seq_len = corpus.vocab_size, config.data.seq_len
  validation = python_docs.evenly_spaced_windows(corpus.validation, config.data.num_validation,
                                                 seq_len)

  def init(rng):
    params = model.init(rng)
    return {"params": params, "opt_state": transform.init(params)}

  def update(state, batch, rng):
    del rng
    loss_fn = lambda p: token_losses(model, p, batch["window"], vocab).mean()
    loss, grads = jax.value_and_grad(loss_fn)(state["params"])
    updates, opt_state = transform.update(grads, state["opt_state"], state["params"])
    return ({"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state},
            {"loss": loss, "bpc": loss / math.log(2.0)})

  def evaluate(state, batch):
    loss = token_losses(model, state["params"], batch["window"], vocab).mean()
    return {"bpc": loss / math.log(2.0)}

  def to_windows(batch):
    starts = window_starts(batch["example"], len(corpus.train), seq_len, config.seed)
    return {"window": python_docs.windows(corpus.train, starts, seq_len)}

  def train_data(process_index, process_count):
    return pipeline.grain_pipeline(pipeline.IndexSource(STREAM_LENGTH),
                                   batch_size=config.train.batch_size, seed=config.seed,
                                   process_index=process_index, process_count=process_count,
                                   shuffle=False, transform=to_windows)

  def eval_data(process_index, process_count):
    return pipeline.grain_pipeline(pipeline.InMemorySource({"window": validation}),
                                   batch_size=len(validation), seed=0,
                                   process_index=process_index, process_count=process_count,
                                   shuffle=False, num_epochs=1)

  return train_loop.Experiment(init=init, update=update, train_data=train_data,
                               evaluate=evaluate, eval_data=eval_data)


def train(config: ml_collections.ConfigDict, corpus: python_docs.CharCorpus,
          workdir: str) -> tuple[PyTree, train_loop.TrainResult]:
  result = train_loop.run(make_experiment(config, corpus), config, workdir, desc="char LM")
  return result.state["params"], result


def attention_kernels(params: PyTree, layer: int, num_heads: int) -> tuple[np.ndarray, np.ndarray]:
  """Per-head query and key factors of one block, each [H, D, D / H] (float32 numpy)."""
  kernel = np.asarray(params["blocks"][layer]["mixer"]["qkv"]["kernel"], np.float32)
  width = kernel.shape[0]
  head = width // num_heads
  split = lambda w: w.reshape(width, num_heads, head).transpose(1, 0, 2)
  return split(kernel[:, :width]), split(kernel[:, width:2 * width])


def merged_matrices(w_q: np.ndarray, w_k: np.ndarray) -> np.ndarray:
  """[H, D, D]: W_h = W_Q,h W_K,h^T / sqrt(d_h), the per-head matrix the logits use."""
  return np.asarray(jax.vmap(pruning.merged_weight)(jnp.asarray(w_q), jnp.asarray(w_k)))


def query_key_of_factors(w_q: np.ndarray, w_k: np.ndarray) -> dict[str, jax.Array]:
  """Per-head factors [H, D, Dh] back to the backbone's [D, D] query and key kernels."""
  join = lambda w: jnp.asarray(w.transpose(1, 0, 2).reshape(w.shape[1], -1))
  return {"w_q": join(w_q), "w_k": join(w_k)}


@functools.lru_cache(maxsize=8)
def _jitted(model: functional.Functional, vocab_size: int):
  """(attention inputs, mean loss) of one model, jitted once: a pruning sweep calls them per
  layer and sparsity, and fresh jits would recompile each time."""
  inputs = jax.jit(lambda p, w, qk: model.apply(p, one_hot_inputs(w, vocab_size),
                                                return_attention_inputs=True,
                                                query_keys=qk)[1])
  loss = jax.jit(lambda p, w, qk: token_losses(model, p, w, vocab_size, qk).mean())
  return inputs, loss


def attention_inputs(model: functional.Functional, params: PyTree, windows: np.ndarray,
                     vocab_size: int, query_keys: Sequence[Any] | None = None) -> list[np.ndarray]:
  """Each block's attention input (after its LayerNorm), [B, L, D], under `query_keys`."""
  inputs, _ = _jitted(model, vocab_size)
  return [np.asarray(x) for x in inputs(params, jnp.asarray(windows), query_keys)]


def bits_per_character(model: functional.Functional, params: PyTree, windows: np.ndarray,
                       vocab_size: int, query_keys: Sequence[Any] | None = None) -> float:
  _, loss = _jitted(model, vocab_size)
  return float(loss(params, jnp.asarray(windows), query_keys)) / math.log(2.0)
