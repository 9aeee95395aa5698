"""ENAMEL test generation: our generator helpers consume the random stream exactly as the
official harness's do, so the generated inputs are the benchmark's."""
import random
import time

import pytest

from jaxlab.methods.enamel import generator_helpers
from jaxlab.methods.enamel import problems
from jaxlab.methods.enamel import testgen

enam_datautils = pytest.importorskip("enam.datautils")

# Problems whose generators call the helpers, plus a few plain ones.
SAMPLE = (0, 1, 6, 13, 24, 31, 56, 61, 75, 88, 94, 119, 150)


def official_inputs(problem):
  """The official scheme: exec prompt + generator in enam's helper scope, seed, call."""
  state = random.getstate()
  try:
    levels = []
    for level, size in enumerate(problem.levels):
      cases = []
      for case in range(testgen.NUM_TESTS[level]):
        scope = dict(time=time, **vars(enam_datautils))
        exec(problem.prompt + "\n" + problem.input_generator, scope)  # pylint: disable=exec-used
        random.seed(testgen.case_seed(problem.index, level, case))
        cases.append(scope["generate_input"](size=size, lid=level, cid=case))
      levels.append(cases)
    return levels
  finally:
    random.setstate(state)


@pytest.mark.parametrize("index", SAMPLE)
def test_generated_inputs_equal_the_official_harness(index):
  problem = problems.load_problems()[index]
  assert testgen.generate_inputs(problem) == official_inputs(problem)


@pytest.mark.parametrize("name,calls", [
    ("rand_parens", [((n,), {}) for n in range(0, 40)] +
     [((n,), {"valid": False}) for n in range(2, 30)] +
     [((n,), {"sep": None}) for n in range(1, 20)] + [((12,), {"par": "[]", "sep": " "})]),
    ("rand_probably_prime", [((n,), {}) for n in (3, 10, 1000, 10**6, 10**9)] +
     [((a, b), {}) for a, b in ((0, 10), (5, 100), (1000, 5000))]),
    ("rand_primality", [((size, lid, cid), {}) for size in (10, 10**4, 10**9)
                        for lid in (0, 2) for cid in range(6)]),
    ("miller_rabin", [((n,), {}) for n in (1, 2, 3, 4, 9, 561, 7919, 10**9 + 7, 2**61 - 1)]),
])
def test_helpers_match_and_leave_the_same_random_state(name, calls):
  ours, theirs = getattr(generator_helpers, name), getattr(enam_datautils, name)
  for seed, (args, kwargs) in enumerate(calls):
    random.seed(seed)
    expected = theirs(*args, **kwargs)
    expected_state = random.getstate()
    random.seed(seed)
    assert ours(*args, **kwargs) == expected, (name, args, kwargs)
    assert random.getstate() == expected_state, (name, args, kwargs)


def test_case_seeds_follow_the_benchmark():
  assert testgen.case_seed(5, 0, 3) == 998244353 ^ 5 ^ 3
  assert testgen.case_seed(5, 2, 1) == 998244353 ^ 5 ^ (8 + 4 + 1)
