"""leap.teachers: each teacher's rule on hand-built histories, and the Bayes-optimal policy
against a brute-force search of the game on 3 receptacles."""
import collections
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.leap import env as env_lib
from jaxlab.methods.leap import teachers

SPEC = env_lib.EnvSpec()
DRAWER1, DRAWER2, FRIDGE = 0, 1, env_lib.RECEPTACLES.index("fridge")


def state_after(actions, hidden=FRIDGE, informative=True, spec=SPEC):
  task = env_lib.Task(obj=jnp.asarray(0, jnp.int32), hidden=jnp.asarray(hidden, jnp.int32),
                      note_informative=jnp.asarray(informative))
  state = env_lib.reset(spec, task)
  for action in actions:
    state, _ = env_lib.step(spec, state, jnp.asarray(action))
  return state


def act(name, state, key=None):
  return int(teachers.policy(SPEC, name)(state, jax.random.key(0) if key is None else key, None))


@pytest.mark.parametrize("history, informative, expected", [
    ([], True, FRIDGE),
    ([DRAWER2], True, FRIDGE),
    ([FRIDGE], True, SPEC.take),
    ([FRIDGE, SPEC.take], True, SPEC.go_table),
    ([FRIDGE, SPEC.take, SPEC.go_table], True, SPEC.put),
])
def test_expert_goes_straight_to_the_hidden_receptacle(history, informative, expected):
  assert act("expert", state_after(history, informative=informative)) == expected


@pytest.mark.parametrize("history, informative, expected", [
    ([], True, SPEC.read_note),                       # look first
    ([SPEC.read_note], True, FRIDGE),                 # follow an informative note
    ([SPEC.read_note], False, DRAWER1),               # blank: canonical order
    ([SPEC.read_note, DRAWER1], False, DRAWER2),      # ... the next unvisited one
    ([DRAWER1], False, SPEC.read_note),               # unread note, object unseen: read it
    ([FRIDGE], False, SPEC.take),                     # seen it: take it
    ([SPEC.read_note, FRIDGE, SPEC.take], True, SPEC.go_table),
])
def test_teacher_alone_searches_without_privilege(history, informative, expected):
  assert act("teacher_alone", state_after(history, informative=informative)) == expected


@pytest.mark.parametrize("history, informative, expected", [
    ([], False, SPEC.read_note),
    ([DRAWER2], False, SPEC.read_note),
    ([SPEC.read_note], False, FRIDGE),                # looked: now privileged
    ([FRIDGE], False, SPEC.take),                     # seen before reading: no need to read
])
def test_leap_teacher_asks_to_look_then_uses_the_privilege(history, informative, expected):
  assert act("leap", state_after(history, informative=informative)) == expected


def test_shares_at_the_ends_are_the_two_teachers_and_mix_in_between():
  states = [state_after([], informative=False), state_after([SPEC.read_note], informative=False),
            state_after([DRAWER2, DRAWER1], informative=True)]
  keys = jax.random.split(jax.random.key(1), 200)
  for state in states:
    for key in keys[:20]:
      assert act("share_0", state, key) == act("teacher_alone", state)
      assert act("share_100", state, key) == act("expert", state)
  state = states[1]
  picks = [act("share_25", state, key) for key in keys]
  assert set(picks) == {act("expert", state), act("teacher_alone", state)}
  assert 0.15 < np.mean([p == act("expert", state) for p in picks]) < 0.35


def test_share_outside_0_to_100_and_unknown_teachers_raise():
  with pytest.raises(ValueError, match="0..100"):
    teachers.share_of("share_120")
  with pytest.raises(ValueError, match="unknown teacher"):
    teachers.policy(SPEC, "oracle")


# -------------------------------------------------------------------------------------------
# Brute force: expectimax over every action sequence of a plain-Python copy of the rules.

World = collections.namedtuple("World", "hidden informative")
PyState = collections.namedtuple("PyState", "location holding visited done")


def python_step(n, world, state, action):
  """(next state, observation) by the rules of env.py, written again without JAX."""
  take, table, put = n + 1, n + 2, n + 3
  if state.done:
    return state, "done"
  if action < n:
    here = action == world.hidden and not state.holding
    return state._replace(location=action, visited=state.visited | {action}), ("at", action,
                                                                              here)
  if action == n:
    return state, ("note", world.hidden if world.informative else "blank")
  if action == take and state.location == world.hidden and not state.holding:
    return state._replace(holding=True), "taken"
  if action == table:
    return state._replace(location="table"), "at table"
  if action == put and state.location == "table" and state.holding:
    return state._replace(done=True), "success"
  return state, "nothing happens"


def brute_force_success(spec, obj):
  n, horizon = spec.num_receptacles, spec.horizon
  prior = spec.prior()[obj]
  start = PyState(location=None, holding=False, visited=frozenset(), done=False)
  belief = tuple((prior[h] * (spec.note_prob if b else 1 - spec.note_prob), World(h, b), start)
                 for h in range(n) for b in (True, False))

  @functools.lru_cache(maxsize=None)
  def best(belief, left):
    won = sum(w for w, _, s in belief if s.done)
    if left == 0:
      return won
    value = won
    for action in range(spec.num_actions):
      branches = collections.defaultdict(list)
      for w, world, s in belief:
        if s.done:
          continue
        nxt, observation = python_step(n, world, s, action)
        branches[observation].append((w, world, nxt))
      value = max(value, won + sum(best(tuple(b), left - 1) for b in branches.values()))
    return value

  return best(belief, horizon)


@pytest.mark.parametrize("note_prob, horizon", [(0.7, 6), (0.3, 5)])
def test_bayes_tables_equal_brute_force_on_three_receptacles(note_prob, horizon):
  spec = env_lib.EnvSpec(num_receptacles=3, num_objects=2, note_prob=note_prob, horizon=horizon,
                         env_seed=3)
  value, _ = teachers.bayes_tables(spec)
  for obj in range(spec.num_objects):
    np.testing.assert_allclose(value[obj, 0, teachers.UNREAD, horizon],
                               brute_force_success(spec, obj), atol=1e-9)


def test_the_bayes_policy_achieves_its_table_value():
  # The jitted policy (table lookups on the live state) plays as well as the table says.
  spec = env_lib.EnvSpec(num_receptacles=5, env_seed=1)
  tasks = env_lib.sample_tasks(spec, jax.random.key(0), 20_000)
  played = jax.jit(lambda t: env_lib.rollout(spec, teachers.policy(spec, "bayes_optimal"), t,
                                             jax.random.key(1)))(tasks)
  success = np.asarray(played.success, float)
  expected = teachers.bayes_expected_success(spec)
  assert abs(success.mean() - expected) < 3 * success.std() / np.sqrt(success.size)
  # And no teacher without privilege does better.
  alone = jax.jit(lambda t: env_lib.rollout(spec, teachers.policy(spec, "teacher_alone"), t,
                                            jax.random.key(1)))(tasks)
  assert float(np.mean(alone.success)) <= expected + 0.01
