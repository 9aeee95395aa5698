"""The least-squares TFDS builders and the grain pipeline."""
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlab.data import least_squares
from jaxlab.data import pipeline


@pytest.fixture(scope="module")
def small_builder(tmp_path_factory):
  config = least_squares.least_squares_config(d=3, n=6, num_train=40, num_test=8)
  return least_squares.load(config, str(tmp_path_factory.mktemp("tfds")))


def test_builder_writes_array_record_without_tensorflow(small_builder):
  source = pipeline.data_source(small_builder, "train")
  assert len(source) == 40
  assert "tensorflow" not in sys.modules
  files = list((__import__("pathlib").Path(small_builder.data_dir)).glob("*.array_record*"))
  assert files


def test_problems_are_consistent_and_float64(small_builder):
  batch = pipeline.data_source(small_builder, "test").__getitems__(list(range(8)))
  assert batch["A"].shape == (8, 6, 3) and batch["A"].dtype == np.float64
  np.testing.assert_allclose(np.einsum("cnd,cd->cn", batch["A"], batch["x_star"]), batch["b"],
                             atol=1e-12)


def test_generation_is_deterministic(tmp_path):
  config = least_squares.least_squares_config(d=2, n=3, num_train=5, num_test=2, seed=4)
  first = pipeline.data_source(least_squares.load(config, str(tmp_path / "a")), "train")
  second = pipeline.data_source(least_squares.load(config, str(tmp_path / "b")), "train")
  np.testing.assert_array_equal(first.columns["A"], second.columns["A"])


def test_condition_number_rescales_singular_values():
  with jax.enable_x64(True):
    problems = least_squares.sample_problems(jax.random.key(0), 4, 10, 3, condition_number=50.0)
    s = np.asarray(jnp.linalg.svd(problems["A"], compute_uv=False))
  np.testing.assert_allclose(s.max(-1), 50.0, rtol=1e-10)
  np.testing.assert_allclose(s.min(-1), 1.0, rtol=1e-10)


def test_pipeline_shards_processes_without_overlap():
  source = pipeline.InMemorySource({"i": np.arange(32)})
  seen = []
  for process in range(2):
    it = pipeline.grain_pipeline(source, batch_size=8, seed=0, process_index=process,
                                 process_count=2, num_epochs=1)
    seen.append(np.concatenate([batch["i"] for batch in it]))
  assert len(seen[0]) == len(seen[1]) == 16
  assert not set(seen[0]) & set(seen[1])
  assert set(seen[0]) | set(seen[1]) == set(range(32))


def test_the_processes_blocks_make_the_one_process_batch_row_for_row():
  source = pipeline.InMemorySource({"i": np.arange(40)})
  whole = pipeline.grain_pipeline(source, batch_size=8, seed=3)
  parts = [pipeline.grain_pipeline(source, batch_size=8, seed=3, process_index=p,
                                   process_count=4) for p in range(4)]
  for _ in range(7):   # past an epoch boundary
    np.testing.assert_array_equal(next(whole)["i"],
                                  np.concatenate([next(it)["i"] for it in parts]))


def test_pipeline_reshuffles_each_epoch_and_restores_state():
  source = pipeline.InMemorySource({"i": np.arange(8)})
  it = pipeline.grain_pipeline(source, batch_size=8, seed=1)
  epoch0, state = next(it)["i"], it.get_state()
  epoch1 = next(it)["i"]
  assert sorted(epoch0) == sorted(epoch1) == list(range(8))
  assert not np.array_equal(epoch0, epoch1)
  again = pipeline.grain_pipeline(source, batch_size=8, seed=1)
  again.set_state(state)
  np.testing.assert_array_equal(next(again)["i"], epoch1)


def test_transform_and_uneven_batches():
  source = pipeline.InMemorySource({"i": np.arange(10)})
  it = pipeline.grain_pipeline(source, batch_size=4, seed=0, shuffle=False, num_epochs=1,
                               transform=lambda b: {"j": b["i"] * 2})
  assert [list(b["j"]) for b in it] == [[0, 2, 4, 6], [8, 10, 12, 14]]
  with pytest.raises(ValueError, match="not divisible by 3 processes"):
    pipeline.grain_pipeline(source, batch_size=4, seed=0, process_count=3)
