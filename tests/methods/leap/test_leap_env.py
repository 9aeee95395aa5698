"""leap.env: the game's rules case by case, and no hidden state in the student's buffer."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.methods.leap import env as env_lib

SPEC = env_lib.EnvSpec()
MUG, APPLE = env_lib.OBJECTS.index("mug"), env_lib.OBJECTS.index("apple")
DRAWER2, FRIDGE = env_lib.RECEPTACLES.index("drawer2"), env_lib.RECEPTACLES.index("fridge")


def task(obj=MUG, hidden=FRIDGE, informative=True):
  return env_lib.Task(obj=jnp.asarray(obj, jnp.int32), hidden=jnp.asarray(hidden, jnp.int32),
                      note_informative=jnp.asarray(informative))


def play(actions, t=None, spec=SPEC):
  state = env_lib.reset(spec, task() if t is None else t)
  for action in actions:
    state, _ = env_lib.step(spec, state, jnp.asarray(action))
  return state


def words(state, step):
  """The action and observation words of step `step` of the buffer."""
  at = 1 + env_lib.STEP_TOKENS * step
  ids = np.asarray(state.tokens[at:at + env_lib.STEP_TOKENS])
  return " ".join(env_lib.VOCAB[i] for i in ids if i != env_lib.PAD)


def test_vocabulary_and_actions():
  assert SPEC.num_actions == 14
  assert SPEC.action_names()[:2] == ("go drawer1", "go drawer2")
  assert SPEC.action_names()[10:] == ("read note", "take", "go table", "put")
  assert len(set(env_lib.VOCAB)) == len(env_lib.VOCAB)
  assert SPEC.length == 31
  np.testing.assert_array_equal(env_lib.prediction_positions(SPEC), [0, 5, 10, 15, 20, 25])


def test_a_successful_episode_word_by_word():
  state = play([FRIDGE, SPEC.take, SPEC.go_table, SPEC.put])
  assert env_lib.VOCAB[int(state.tokens[0])] == "mug"
  assert [words(state, t) for t in range(4)] == [
      "go_fridge at fridge see mug", "take taken", "go_table at table", "put success"]
  assert bool(state.done) and int(state.steps) == 4


def test_looking_in_the_wrong_place_and_reading_the_note():
  state = play([DRAWER2, SPEC.read_note])
  assert words(state, 0) == "go_drawer2 at drawer2 see nothing"
  assert words(state, 1) == "read_note note fridge"
  blank = play([SPEC.read_note], task(informative=False))
  assert words(blank, 0) == "read_note note blank"


@pytest.mark.parametrize("actions, last", [
    ([SPEC.take], "take nothing happens"),                     # not at the object
    ([DRAWER2, SPEC.take], "take nothing happens"),            # at the wrong receptacle
    ([FRIDGE, SPEC.take, SPEC.take], "take nothing happens"),  # already holding it
    ([SPEC.put], "put nothing happens"),                       # not holding it
    ([FRIDGE, SPEC.take, SPEC.put], "put nothing happens"),    # holding it, not at the table
])
def test_invalid_actions_waste_a_step(actions, last):
  before = play(actions[:-1])
  after = play(actions)
  assert words(after, len(actions) - 1) == last
  assert int(after.steps) == int(before.steps) + 1
  for field in ("location", "holding", "done", "note_read"):
    assert bool(jnp.all(getattr(after, field) == getattr(before, field))), field


def test_the_object_is_gone_once_taken():
  state = play([FRIDGE, SPEC.take, DRAWER2, FRIDGE])
  assert words(state, 3) == "go_fridge at fridge see nothing"


def test_nothing_changes_after_success_or_past_the_horizon():
  done = play([FRIDGE, SPEC.take, SPEC.go_table, SPEC.put])
  later = play([FRIDGE, SPEC.take, SPEC.go_table, SPEC.put, SPEC.read_note])
  np.testing.assert_array_equal(done.tokens, later.tokens)
  full = play([DRAWER2] * SPEC.horizon)
  more = play([DRAWER2] * SPEC.horizon + [SPEC.read_note])
  np.testing.assert_array_equal(full.tokens, more.tokens)
  assert int(more.steps) == SPEC.horizon


def test_the_buffer_shows_nothing_hidden_until_a_visit_or_the_note_reveals_it():
  # Two games that differ only in hidden fields give the same buffer for any actions that
  # neither visit the hidden receptacles nor read an informative note.
  rng = np.random.default_rng(0)
  searchable = [r for r in range(SPEC.num_receptacles) if r not in (DRAWER2, FRIDGE)]
  for _ in range(20):
    actions = rng.choice(searchable + [SPEC.take, SPEC.go_table, SPEC.put, SPEC.read_note],
                         size=SPEC.horizon)
    a = play(actions, task(hidden=DRAWER2, informative=False))
    b = play(actions, task(hidden=FRIDGE, informative=False))
    np.testing.assert_array_equal(a.tokens, b.tokens)
  # An informative note differs from a blank one only from the step that reads it.
  read_at = 2
  actions = [searchable[0], searchable[1], SPEC.read_note]
  a = play(actions, task(informative=True))
  b = play(actions, task(informative=False))
  cut = 1 + env_lib.STEP_TOKENS * read_at
  np.testing.assert_array_equal(a.tokens[:cut], b.tokens[:cut])
  assert words(a, read_at) != words(b, read_at)


def test_tasks_follow_the_prior_and_the_note_probability():
  tasks = env_lib.sample_tasks(SPEC, jax.random.key(0), 20_000)
  prior = SPEC.prior()
  np.testing.assert_allclose(prior.sum(axis=1), 1.0, rtol=1e-6)
  assert abs(float(np.mean(tasks.note_informative)) - SPEC.note_prob) < 0.02
  obj = np.asarray(tasks.obj)
  hidden = np.asarray(tasks.hidden)[obj == APPLE]
  counts = np.bincount(hidden, minlength=SPEC.num_receptacles) / hidden.size
  np.testing.assert_allclose(counts, prior[APPLE], atol=0.03)


@pytest.mark.parametrize("kwargs, key", [({"horizon": 3}, "env.horizon"),
                                         ({"note_prob": 1.5}, "env.note_prob"),
                                         ({"num_receptacles": 11}, "env.num_receptacles")])
def test_bad_specs_name_their_key(kwargs, key):
  with pytest.raises(ValueError, match=key):
    env_lib.EnvSpec(**kwargs)
