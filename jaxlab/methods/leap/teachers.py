"""Written-out teachers: policies of one episode's `env.State` (hidden fields included).

* `expert` (privileged): go to the true receptacle, take, go table, put.
* `teacher_alone` (no privileged state, generic sense): read the note while it is unread and the
  object unseen; follow an informative note, else visit unvisited receptacles in canonical order;
  take, go table, put.
* `leap`: `read note` while the note is unread and the object unseen, else `expert`. Its advice
  is generic where the student must still gather information (the official correction prompt
  asks for general principles and forbids revealing the privileged state), and privileged once
  the student has looked.
* `share_<p>`: per relabelled step `expert` with probability p/100, else `teacher_alone` (our
  reading of the repository's 0-100% privileged-share prompts).
* `bayes_optimal`: the best policy of the student's information state, from an exact dynamic
  programme over (object, visited set, note status, steps left).

Every teacher is `teacher(spec, state, key) -> action`, for relabelling a student's own states;
`policy(spec, name)` wraps one for `env.rollout`.
"""
from __future__ import annotations

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np

from jaxlab.methods.leap import env as env_lib

BASE_TEACHERS = ("expert", "teacher_alone", "leap", "bayes_optimal")
SHARE_PATTERN = re.compile(r"^share_(-?\d+)$")


def share_of(name: str) -> int | None:
  """p of `share_<p>`, None for other names; ValueError for p outside 0..100."""
  match = SHARE_PATTERN.match(name)
  if match is None:
    return None
  share = int(match.group(1))
  if not 0 <= share <= 100:
    raise ValueError(f"{name}: the privileged share p must be in 0..100, got {share}")
  return share


def _deliver(spec: env_lib.EnvSpec, state: env_lib.State, target: jax.Array) -> jax.Array:
  """Take the object at `target` and deliver it: go there, take, go table, put."""
  at_target = state.location == target
  return jnp.where(state.holding,
                   jnp.where(state.location == spec.table, spec.put, spec.go_table),
                   jnp.where(at_target, spec.take, target))


def expert(spec: env_lib.EnvSpec, state: env_lib.State, key: jax.Array | None = None
           ) -> jax.Array:
  del key
  return _deliver(spec, state, state.task.hidden).astype(jnp.int32)


def _must_look(state: env_lib.State) -> jax.Array:
  """The note is unread and the object unseen (nor in hand)."""
  return ~state.note_read & ~state.visited[state.task.hidden] & ~state.holding


def teacher_alone(spec: env_lib.EnvSpec, state: env_lib.State, key: jax.Array | None = None
                  ) -> jax.Array:
  del key
  task = state.task
  unvisited = ~state.visited
  first_unvisited = jnp.argmax(unvisited)
  # Only what the history shows: the note's receptacle if it was read and informative, or the
  # receptacle where the object was seen.
  known = env_lib.knows_location(state)
  search = jnp.where(known, _deliver(spec, state, task.hidden), first_unvisited)
  return jnp.where(_must_look(state), spec.read_note, search).astype(jnp.int32)


def leap(spec: env_lib.EnvSpec, state: env_lib.State, key: jax.Array | None = None
         ) -> jax.Array:
  return jnp.where(_must_look(state), spec.read_note, expert(spec, state, key)).astype(jnp.int32)


def share(spec: env_lib.EnvSpec, percent: int, state: env_lib.State, key: jax.Array
          ) -> jax.Array:
  privileged = jax.random.bernoulli(key, percent / 100.0)
  return jnp.where(privileged, expert(spec, state), teacher_alone(spec, state)).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
# The Bayes-optimal policy of the student's information state.

UNREAD, BLANK = 0, 1


@functools.lru_cache(maxsize=None)
def bayes_tables(spec: env_lib.EnvSpec) -> tuple[np.ndarray, np.ndarray]:
  """(value, action), each [num_objects, 2^num_receptacles, 2, horizon + 1]: the success
  probability of acting optimally, and the optimal search action, while the object's place is
  unknown. Indexed by object, visited set (bit r = receptacle r), note status (`UNREAD`, or
  `BLANK`: read, blank) and steps left. With the place known, optimal play is `expert`'s (3 steps
  from its receptacle: take, go table, put).

  Unknown place: the posterior is the prior renormalised over unvisited receptacles (a blank
  note says nothing about the place). `go r` finds the object with its posterior probability (a
  success if >= 3 steps remain after it); `read note` reveals it with probability `note_prob`
  (then 4 steps are needed). Ties go to the lowest action index.
  """
  n, horizon, q = spec.num_receptacles, spec.horizon, spec.note_prob
  masks = np.arange(2 ** n)
  bits = (masks[:, None] >> np.arange(n)[None]) & 1                  # [M, n]
  prior = spec.prior()
  value = np.zeros((spec.num_objects, 2 ** n, 2, horizon + 1))
  action = np.zeros((spec.num_objects, 2 ** n, 2, horizon + 1), np.int32)
  for obj in range(spec.num_objects):
    mass = prior[obj][None] * (1 - bits)                                 # [M, n]
    total = mass.sum(axis=1)
    posterior = np.divide(mass, total[:, None], out=np.zeros_like(mass),
                          where=total[:, None] > 0)
    for left in range(1, horizon + 1):
      # Options per note status: go r (n of them), then read note.
      options = np.zeros((2 ** n, 2, n + 1))
      found_in_time = float(left - 1 >= 3)
      for r in range(n):
        after = value[obj, masks | (1 << r), :, left - 1]                # [M, 2]
        p = posterior[:, r][:, None]
        options[:, :, r] = np.where(bits[:, r][:, None] == 1, value[obj, :, :, left - 1],
                                    p * found_in_time + (1 - p) * after)
      read_in_time = float(left - 1 >= 4)
      options[:, UNREAD, n] = (q * read_in_time * (total > 0)
                               + (1 - q) * value[obj, :, BLANK, left - 1])
      options[:, BLANK, n] = value[obj, :, BLANK, left - 1]              # reading again: wasted
      best = options.max(axis=-1)
      # Lowest index among (numerically) tied options.
      chosen = np.argmax(options >= best[..., None] - 1e-12, axis=-1)
      value[obj, :, :, left] = best
      action[obj, :, :, left] = chosen
  return value, action


def bayes_expected_success(spec: env_lib.EnvSpec) -> float:
  """The optimal policy's exact success probability, averaged over the uniform object."""
  value, _ = bayes_tables(spec)
  return float(value[:, 0, UNREAD, spec.horizon].mean())


def bayes_optimal(spec: env_lib.EnvSpec, state: env_lib.State, key: jax.Array | None = None
                  ) -> jax.Array:
  del key
  _, table = bayes_tables(spec)
  mask = (state.visited.astype(jnp.int32) << jnp.arange(spec.num_receptacles)).sum()
  status = jnp.where(state.note_read, BLANK, UNREAD)
  left = jnp.clip(spec.horizon - state.steps, 0, spec.horizon)
  search = jnp.asarray(table)[state.task.obj, mask, status, left]
  return jnp.where(env_lib.knows_location(state), expert(spec, state), search).astype(jnp.int32)


def policy(spec: env_lib.EnvSpec, name: str):
  """`policy(state, key, step) -> action` of a teacher by name (`share_<p>` included), for
  `env.rollout` (teachers read the state, not the step)."""
  percent = share_of(name)
  if percent is not None:
    act = functools.partial(share, spec, percent)
  else:
    table = {"expert": expert, "teacher_alone": teacher_alone, "leap": leap,
             "bayes_optimal": bayes_optimal}
    if name not in table:
      raise ValueError(f"unknown teacher {name!r}; known: {', '.join(BASE_TEACHERS)}, "
                       "share_<p>")
    act = functools.partial(table[name], spec)
  return lambda state, key, step: act(state, key)
