"""lotus metrics against hand-computed values."""
import numpy as np
import pytest

from jaxlab.methods.lotus import metrics


def test_affine_alignment_recovers_scale_and_shift():
  rng = np.random.default_rng(0)
  target = rng.uniform(1, 5, size=(3, 4, 4))
  prediction = (target - 0.7) / 2.5
  np.testing.assert_allclose(metrics.align_affine(prediction, target), target, atol=1e-9)
  scores = metrics.depth_metrics(prediction, target)
  assert scores["absrel"] == pytest.approx(0.0, abs=1e-9) and scores["delta1"] == 1.0


def test_depth_metrics_by_hand():
  target = np.array([[[1.0, 2.0], [4.0, 8.0]]])
  # After alignment a prediction equal to the target except one pixel: compute by hand on a
  # prediction that is already aligned-optimal (the target itself plus a zero-mean error that is
  # orthogonal to [target, 1] would stay; here simply check a known aligned case).
  aligned = metrics.align_affine(np.array([[[0.0, 1.0], [3.0, 7.0]]]), target)
  np.testing.assert_allclose(aligned, target, atol=1e-9)
  prediction = np.array([[[1.0, 2.0], [4.0, 16.0]]])
  aligned = metrics.align_affine(prediction, target)[0]
  design = np.stack([prediction.ravel(), np.ones(4)], 1)
  (s, b), *_ = np.linalg.lstsq(design, target.ravel(), rcond=None)
  np.testing.assert_allclose(aligned.ravel(), s * prediction.ravel() + b)
  expected_absrel = np.mean(np.abs(np.maximum(aligned.ravel(), 1e-3) - target.ravel())
                            / target.ravel())
  assert metrics.depth_metrics(prediction, target)["absrel"] == pytest.approx(expected_absrel)


def test_normal_metrics_by_hand():
  target = np.zeros((1, 1, 2, 3))
  target[..., 2] = 1.0
  prediction = np.zeros((1, 1, 2, 3))
  prediction[0, 0, 0] = [0.0, 0.0, 5.0]                                  # 0 degrees
  prediction[0, 0, 1] = [np.sin(np.radians(20)), 0.0, np.cos(np.radians(20))]   # 20 degrees
  scores = metrics.normal_metrics(prediction, target)
  assert scores["mean_angle"] == pytest.approx(10.0, abs=1e-6)
  assert scores["within_11_25"] == 0.5


def test_edge_error_uses_only_edge_pixels():
  target = np.ones((1, 2, 2)) * 2.0
  target[0, 0, 0] = 4.0
  prediction = target.copy()
  prediction[0, 1, 1] = 100.0        # a wrong pixel away from the edge mask
  edges = np.zeros_like(target, bool)
  edges[0, 0, 0] = True
  error = metrics.edge_depth_error(prediction, target, edges)
  aligned = metrics.align_affine(prediction, target)
  assert error == pytest.approx(abs(aligned[0, 0, 0] - 4.0) / 4.0)


def test_occlusion_edges_mark_both_sides_of_an_object_boundary_only():
  depth = np.full((1, 4, 4), 5.0)
  object_id = np.zeros((1, 4, 4), int)
  depth[0, 1:3, 1:3] = 2.0
  object_id[0, 1:3, 1:3] = 1
  depth[0, 3, :] = 5.6            # same surface, a 12% jump: not an occlusion
  edges = metrics.occlusion_edges(depth, object_id)
  assert edges[0, 1, 1] and edges[0, 0, 1] and edges[0, 1, 0]
  assert not edges[0, 0, 0] and not edges[0, 3, 0]
