"""The helpers that ENAMEL's input generators find in their scope.

The benchmark's generators (the `input_generator` column of `enamel.csv`) call `rand_parens`,
`rand_probably_prime`, `rand_primality` (and through them `miller_rabin`) and use the `random` and
`string` modules without importing them. To reproduce the benchmark's test inputs exactly, each
helper here makes the same calls on the global `random` stream, in the same order, as the
original harness's helpers: the generated inputs then depend only on the seed.
`tests/methods/enamel/test_generation.py` checks this against the `enam` package.
"""
from __future__ import annotations

import random
import string
import time
from typing import Any


def rand_parens(size: int, valid: bool = True, par: str = "()", sep: str | None = ""
                ) -> Any:
  """A random bracket string of about `size` characters.

  valid: a balanced sequence split into top-level groups (joined by `sep`; `sep=None` returns
  the list of groups). At each position a new group opens when the depth is 0; otherwise a coin
  flip opens, unless only enough positions remain to close (then it closes).
  invalid: two balanced halves around a misplaced `)(`.
  """
  opening, closing = par[0], par[1]
  if not valid:
    assert sep == "", "an invalid sequence has no groups to separate"
    half = (size + 1) // 2 - 1
    return (rand_parens(half, True, par) + closing + opening + rand_parens(half, True, par))
  length = size + size % 2
  groups: list[list[str]] = []
  depth = 0
  for position in range(length):
    remaining = length - position
    # The coin is only flipped when both moves are possible (short-circuit, as the benchmark).
    if depth == 0 or (depth < remaining and random.randint(0, 1)):
      if depth == 0:
        groups.append([])
      groups[-1].append(opening)
      depth += 1
    else:
      groups[-1].append(closing)
      depth -= 1
  texts = ["".join(group) for group in groups]
  return texts if sep is None else sep.join(texts)


def miller_rabin(n: int, k: int = 5) -> bool:
  """Probabilistic primality test with `k` random witnesses (drawn from the global stream)."""
  if n in (2, 3):
    return True
  if n == 1 or n % 2 == 0:
    return False
  exponent, odd = 0, n - 1
  while odd % 2 == 0:
    exponent, odd = exponent + 1, odd // 2
  for _ in range(k):
    witness = pow(random.randint(2, n - 2), odd, n)
    if witness in (1, n - 1):
      continue
    for _ in range(exponent - 1):
      witness = pow(witness, 2, n)
      if witness == n - 1:
        break
    else:
      return False
  return True


def rand_probably_prime(lb: int, ub: int | None = None) -> int:
  """A probable prime, uniform rejection sampling in [lb // 2, lb] (one argument: Bertrand's
  postulate guarantees a prime there) or in [max(lb, 0), max(2 lb, ub, 3)]."""
  if ub is None:
    lb = max(lb, 3)
    low, high = lb // 2, lb
  else:
    low = max(lb, 0)
    high = max(low * 2, ub, 3)
  candidate = random.randint(low, high)
  while not miller_rabin(candidate):
    candidate = random.randint(low, high)
  return candidate


def rand_primality(size: int, lid: int, cid: int) -> int:
  """A primality-test input: fixed tricky cases on level 0, then a prime, a prime square or a
  semiprime of magnitude `size`, by case index."""
  size = max(size, 4)
  fixed = {0: 2 * 3 * 5 * 7 * 11 * 13 + 1, 1: 561, 2: 2, 3: 125}   # 30031 = 59 * 509; Carmichael
  if lid == 0 and cid in fixed:
    return fixed[cid]
  if cid % 3 == 0:
    return rand_probably_prime(size)
  root = int(size**0.5 + 1)
  if cid % 3 == 1:
    return rand_probably_prime(root) ** 2
  return rand_probably_prime(root) * rand_probably_prime(root)


def generator_scope() -> dict[str, Any]:
  """A fresh scope to exec a generator in: the modules and helpers the benchmark provides."""
  return {"random": random, "string": string, "time": time, "rand_parens": rand_parens,
          "miller_rabin": miller_rabin, "rand_probably_prime": rand_probably_prime,
          "rand_primality": rand_primality}
