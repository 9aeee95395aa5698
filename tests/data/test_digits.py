"""The digits TFDS builder: sizes, stratified split, values, determinism."""
import numpy as np

from jaxlab.data import digits


def test_digits_split_is_stratified_exact_and_disjoint(tmp_path):
  config = digits.digits_config(num_test=100, seed=3)
  train_x, train_y = digits.load_arrays("train", config, str(tmp_path))
  test_x, test_y = digits.load_arrays("test", config, str(tmp_path))
  assert train_x.shape == (1697, 8, 8, 1) and test_x.shape == (100, 8, 8, 1)
  assert train_x.dtype == np.uint8 and train_x.max() == 16 and train_x.min() == 0
  assert np.all(np.abs(np.bincount(test_y, minlength=10) - 10) <= 1)
  train_rows = {row.tobytes() for row in train_x.reshape(len(train_x), -1)}
  overlap = sum(row.tobytes() in train_rows for row in test_x.reshape(len(test_x), -1))
  assert overlap <= 2   # a handful of digits are pixel-identical duplicates in the dataset
  again_x, again_y = digits.load_arrays("test", config, str(tmp_path))
  np.testing.assert_array_equal(again_x, test_x)
  np.testing.assert_array_equal(again_y, test_y)
