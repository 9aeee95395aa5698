"""A partially observable find-and-deliver household game, in pure JAX (jit- and vmap-able).

The agent must bring one object to the `table`. The object lies in one of `num_receptacles`
receptacles (the first of `drawer1 drawer2 drawer3 cabinet1 cabinet2 cabinet3 shelf1 shelf2
fridge countertop`), drawn from the object's prior (Dirichlet(0.5), fixed by `env_seed`). With
probability `note_prob` a note names the receptacle; otherwise the note is blank. Both the
receptacle and the note's content are hidden until an action reveals them.

Actions (`num_receptacles + 4`): `go <receptacle>` for each receptacle, then `read note`, `take`,
`go table`, `put`. Observations, as word tokens:

  go r        ->  at r see <object>   or   at r see nothing
  read note   ->  note <receptacle>   or   note blank
  take        ->  taken               (at the object's receptacle, hands empty)
  go table    ->  at table
  put         ->  success             (at the table, holding the object; the episode ends)
  otherwise   ->  nothing happens     (the step is wasted)

The student reads `<object>` and then, per step, the action token and four observation slots
(padded with `<pad>`): `1 + 5 * horizon` tokens, one buffer per episode. Nothing hidden ever
enters that buffer except through `read note` or a visit, which a test checks.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

RECEPTACLES = ("drawer1", "drawer2", "drawer3", "cabinet1", "cabinet2", "cabinet3", "shelf1",
               "shelf2", "fridge", "countertop")
OBJECTS = ("mug", "apple", "key", "book", "knife", "soap")
OBSERVATION_WORDS = ("at", "see", "nothing", "note", "blank", "taken", "happens", "success")
ACTION_WORDS = tuple(f"go_{r}" for r in RECEPTACLES) + ("read_note", "take", "go_table", "put")
VOCAB = (("<pad>",) + OBJECTS + RECEPTACLES + ("table",) + OBSERVATION_WORDS + ACTION_WORDS)
TOKEN = {word: index for index, word in enumerate(VOCAB)}
PAD = TOKEN["<pad>"]
OBSERVATION_SLOTS = 4
STEP_TOKENS = 1 + OBSERVATION_SLOTS
MIN_HORIZON = 4     # go, take, go table, put: the shortest success


@dataclasses.dataclass(frozen=True)
class EnvSpec:
  """The game's fixed numbers (static: a change compiles anew)."""
  num_receptacles: int = 10
  num_objects: int = 6
  note_prob: float = 0.7
  horizon: int = 6
  env_seed: int = 0
  prior_concentration: float = 0.5

  def __post_init__(self):
    if not 1 <= self.num_receptacles <= len(RECEPTACLES):
      raise ValueError(f"env.num_receptacles must be in 1..{len(RECEPTACLES)}, got "
                       f"{self.num_receptacles}")
    if not 1 <= self.num_objects <= len(OBJECTS):
      raise ValueError(f"env.num_objects must be in 1..{len(OBJECTS)}, got {self.num_objects}")
    if not 0.0 <= self.note_prob <= 1.0:
      raise ValueError(f"env.note_prob must be in [0, 1], got {self.note_prob}")
    if self.horizon < MIN_HORIZON:
      raise ValueError(f"env.horizon must be >= {MIN_HORIZON} (go, take, go table, put), got "
                       f"{self.horizon}")
    if self.prior_concentration <= 0:
      raise ValueError(f"env.prior_concentration must be > 0, got {self.prior_concentration}")

  @property
  def num_actions(self) -> int:
    return self.num_receptacles + 4

  @property
  def read_note(self) -> int:
    return self.num_receptacles

  @property
  def take(self) -> int:
    return self.num_receptacles + 1

  @property
  def go_table(self) -> int:
    return self.num_receptacles + 2

  @property
  def put(self) -> int:
    return self.num_receptacles + 3

  @property
  def table(self) -> int:
    """The table's location index (receptacles are 0 .. num_receptacles - 1)."""
    return self.num_receptacles

  @property
  def length(self) -> int:
    """Tokens in an episode's buffer: `<object>` and `horizon` steps."""
    return 1 + STEP_TOKENS * self.horizon

  def action_names(self) -> tuple[str, ...]:
    return (tuple(f"go {r}" for r in RECEPTACLES[:self.num_receptacles])
            + ("read note", "take", "go table", "put"))

  def action_tokens(self) -> np.ndarray:
    """[num_actions] vocabulary id of each action."""
    go = [TOKEN[f"go_{r}"] for r in RECEPTACLES[:self.num_receptacles]]
    return np.asarray(go + [TOKEN[w] for w in ("read_note", "take", "go_table", "put")],
                      np.int32)

  def prior(self) -> np.ndarray:
    """[num_objects, num_receptacles] p(receptacle | object), fixed by `env_seed`."""
    rng = np.random.default_rng(self.env_seed)
    return rng.dirichlet(np.full(self.num_receptacles, self.prior_concentration),
                         size=self.num_objects)


def prediction_positions(spec: EnvSpec) -> np.ndarray:
  """[horizon] the buffer position whose next token is step t's action (the last token before
  it): 0 (the object) for step 0, then the last observation slot of step t - 1."""
  return STEP_TOKENS * np.arange(spec.horizon)


class Task(NamedTuple):
  """One episode's draw (arrays of one episode, or [N] for a batch)."""
  obj: jax.Array            # int: which object is wanted
  hidden: jax.Array         # int: the receptacle that holds it (hidden)
  note_informative: jax.Array  # bool: the note names it (hidden until read)


class State(NamedTuple):
  """Everything about one episode; the student sees only `tokens`."""
  task: Task
  location: jax.Array       # int: -1 at the start, a receptacle, or `spec.table`
  holding: jax.Array        # bool
  note_read: jax.Array      # bool
  visited: jax.Array        # [num_receptacles] bool
  done: jax.Array           # bool: delivered (success); later actions change nothing
  steps: jax.Array          # int: actions taken
  tokens: jax.Array         # [spec.length] the student's input buffer
  actions: jax.Array        # [horizon] actions taken (-1 where none)


def sample_tasks(spec: EnvSpec, key: jax.Array, count: int) -> Task:
  """`count` tasks: a uniform object, its receptacle from the prior, an informative note with
  probability `note_prob`."""
  object_key, hidden_key, note_key = jax.random.split(key, 3)
  obj = jax.random.randint(object_key, (count,), 0, spec.num_objects)
  log_prior = jnp.log(jnp.asarray(spec.prior(), jnp.float32))
  hidden = jax.random.categorical(hidden_key, log_prior[obj])
  informative = jax.random.bernoulli(note_key, spec.note_prob, (count,))
  return Task(obj=obj.astype(jnp.int32), hidden=hidden.astype(jnp.int32),
              note_informative=informative)


def concatenate_tasks(*parts: Task) -> Task:
  return jax.tree.map(lambda *a: jnp.concatenate(a), *parts)


def reset(spec: EnvSpec, task: Task) -> State:
  """The start of one episode: nowhere, empty-handed, the buffer holding only `<object>`."""
  tokens = jnp.full((spec.length,), PAD, jnp.int32).at[0].set(TOKEN[OBJECTS[0]] + task.obj)
  return State(task=task, location=jnp.asarray(-1, jnp.int32), holding=jnp.asarray(False),
               note_read=jnp.asarray(False), visited=jnp.zeros((spec.num_receptacles,), bool),
               done=jnp.asarray(False), steps=jnp.asarray(0, jnp.int32), tokens=tokens,
               actions=jnp.full((spec.horizon,), -1, jnp.int32))


def _words(*words: str | jax.Array) -> jax.Array:
  """[OBSERVATION_SLOTS] token ids: strings by name, arrays as given, then `<pad>`."""
  ids = [jnp.asarray(TOKEN[w] if isinstance(w, str) else w, jnp.int32) for w in words]
  ids += [jnp.asarray(PAD, jnp.int32)] * (OBSERVATION_SLOTS - len(ids))
  return jnp.stack(ids)


def step(spec: EnvSpec, state: State, action: jax.Array) -> tuple[State, jax.Array]:
  """One action -> (next state, success now). After success, or past the horizon, nothing
  changes (the buffer gets no more tokens)."""
  task = state.task
  active = ~state.done & (state.steps < spec.horizon)
  is_go = action < spec.num_receptacles
  receptacle = jnp.clip(action, 0, spec.num_receptacles - 1)
  object_here = (receptacle == task.hidden) & ~state.holding
  at_object = (state.location == task.hidden) & ~state.holding
  can_take = (action == spec.take) & at_object
  can_put = (action == spec.put) & (state.location == spec.table) & state.holding
  is_read = action == spec.read_note
  is_table = action == spec.go_table

  receptacle_token = TOKEN[RECEPTACLES[0]] + receptacle
  seen = jnp.where(object_here, TOKEN[OBJECTS[0]] + task.obj, TOKEN["nothing"])
  note_word = jnp.where(task.note_informative, TOKEN[RECEPTACLES[0]] + task.hidden,
                        TOKEN["blank"])
  observation = jnp.select(
      [is_go, is_read, can_take, is_table, can_put],
      [_words("at", receptacle_token, "see", seen), _words("note", note_word),
       _words("taken"), _words("at", "table"), _words("success")],
      _words("nothing", "happens"))
  action_token = jnp.asarray(spec.action_tokens())[jnp.clip(action, 0, spec.num_actions - 1)]
  written = jnp.concatenate([action_token[None], observation])
  at = 1 + STEP_TOKENS * jnp.minimum(state.steps, spec.horizon - 1)
  tokens = jnp.where(active, jax.lax.dynamic_update_slice(state.tokens, written, (at,)),
                     state.tokens)

  location = jnp.where(is_go, receptacle, jnp.where(is_table, spec.table, state.location))
  visited = state.visited | (is_go & (jnp.arange(spec.num_receptacles) == receptacle))
  new = State(task=task, location=location, holding=state.holding | can_take,
              note_read=state.note_read | is_read, visited=visited, done=state.done | can_put,
              steps=state.steps + 1, tokens=tokens,
              actions=state.actions.at[jnp.minimum(state.steps, spec.horizon - 1)].set(action))
  new = jax.tree.map(lambda n, o: jnp.where(active, n, o), new, state)
  return new, active & can_put


def knows_location(state: State) -> jax.Array:
  """The student's history already reveals where the object is (read from an informative note,
  seen on a visit, or in hand)."""
  task = state.task
  return ((state.note_read & task.note_informative) | state.visited[task.hidden]
          | state.holding)


class Rollout(NamedTuple):
  """A batch of finished episodes, [N, ...]; `states` are the states each step acted in,
  [N, horizon, ...] (the student's own history at that step)."""
  final: State
  states: State
  actions: jax.Array        # [N, horizon] -1 after the episode ended
  success: jax.Array        # [N] bool


def rollout(spec: EnvSpec, policy, tasks: Task, key: jax.Array) -> Rollout:
  """Plays `policy(state, key, step) -> action` (one episode's state) on every task, episodes
  vmapped. The `horizon` steps are unrolled (a handful), so `step` is a static int: a student
  then reads only the `1 + STEP_TOKENS * step` tokens its action depends on, less than half the
  cost of reading the whole buffer every step. The policy may read hidden fields (a teacher) or
  only `state.tokens` (the student)."""
  count = tasks.obj.shape[0]
  keys = jax.random.split(key, (count, spec.horizon))

  def one(task, episode_keys):
    state, states, actions = reset(spec, task), [], []
    for t in range(spec.horizon):
      action = policy(state, episode_keys[t], t)
      states.append(state)
      actions.append(jnp.where(state.done, -1, action))
      state, _ = step(spec, state, action)
    return state, jax.tree.map(lambda *s: jnp.stack(s), *states), jnp.stack(actions)

  final, states, actions = jax.vmap(one)(tasks, keys)
  return Rollout(final=final, states=states, actions=actions, success=final.done)
