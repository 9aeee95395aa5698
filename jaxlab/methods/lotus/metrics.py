"""Dense-prediction metrics: affine-invariant depth (AbsRel, delta1) and surface normals (mean
angular error, fraction within 11.25 degrees), plus the error near depth discontinuities.

Depth predictions are affine-invariant (the model predicts depth normalised per image), so each
prediction is aligned to the ground truth by the least-squares scale and shift over the image's
valid pixels before scoring, the protocol of Marigold and Lotus.
"""
from __future__ import annotations

import numpy as np


def align_affine(prediction: np.ndarray, target: np.ndarray,
                 mask: np.ndarray | None = None) -> np.ndarray:
  """prediction [N, H, W] -> s * prediction + b per image, (s, b) = least squares on `mask`."""
  prediction = np.asarray(prediction, np.float64)
  target = np.asarray(target, np.float64)
  mask = np.ones_like(target, bool) if mask is None else np.asarray(mask, bool)
  aligned = np.empty_like(prediction)
  for i in range(len(prediction)):
    p, t = prediction[i][mask[i]], target[i][mask[i]]
    design = np.stack([p, np.ones_like(p)], axis=1)
    (scale, shift), *_ = np.linalg.lstsq(design, t, rcond=None)
    aligned[i] = scale * prediction[i] + shift
  return aligned


def depth_metrics(prediction: np.ndarray, target: np.ndarray,
                  mask: np.ndarray | None = None) -> dict[str, float]:
  """AbsRel = mean |d - d*| / d* and delta1 = fraction with max(d/d*, d*/d) < 1.25, after
  per-image affine alignment; aligned depths are floored at a small positive value."""
  mask = np.ones_like(target, bool) if mask is None else np.asarray(mask, bool)
  aligned = np.maximum(align_affine(prediction, target, mask), 1e-3)
  t = np.asarray(target, np.float64)[mask]
  a = aligned[mask]
  ratio = np.maximum(a / t, t / a)
  return {"absrel": float(np.mean(np.abs(a - t) / t)), "delta1": float(np.mean(ratio < 1.25))}


def normal_metrics(prediction: np.ndarray, target: np.ndarray,
                   mask: np.ndarray | None = None) -> dict[str, float]:
  """Mean angle (degrees) between predicted (renormalised) and true normals [N, H, W, 3], and
  the fraction of pixels within 11.25 degrees."""
  p = np.asarray(prediction, np.float64)
  p = p / np.maximum(np.linalg.norm(p, axis=-1, keepdims=True), 1e-8)
  cosine = np.clip(np.sum(p * np.asarray(target, np.float64), axis=-1), -1.0, 1.0)
  angle = np.degrees(np.arccos(cosine))
  if mask is not None:
    angle = angle[np.asarray(mask, bool)]
  return {"mean_angle": float(np.mean(angle)), "within_11_25": float(np.mean(angle < 11.25))}


def edge_depth_error(prediction: np.ndarray, target: np.ndarray, edges: np.ndarray) -> float:
  """AbsRel of the aligned depth restricted to pixels next to a depth discontinuity."""
  aligned = np.maximum(align_affine(prediction, target), 1e-3)
  edges = np.asarray(edges, bool)
  t = np.asarray(target, np.float64)
  return float(np.mean(np.abs(aligned[edges] - t[edges]) / t[edges]))


def occlusion_edges(depth: np.ndarray, object_id: np.ndarray, threshold: float = 0.1
                    ) -> np.ndarray:
  """bool [N, H, W]: pixels with a 4-neighbour on another surface whose depth differs by more
  than `threshold` (relative). The surface test keeps the far ground near the horizon, where a
  plane's depth jumps between rows, out of the mask."""
  depth = np.asarray(depth, np.float64)
  object_id = np.asarray(object_id)
  edges = np.zeros(depth.shape, bool)
  for axis in (-1, -2):
    near = [slice(None)] * depth.ndim
    far = [slice(None)] * depth.ndim
    near[axis], far[axis] = slice(None, -1), slice(1, None)
    near, far = tuple(near), tuple(far)
    jump = np.abs(depth[near] - depth[far]) / np.minimum(depth[near], depth[far]) > threshold
    boundary = jump & (object_id[near] != object_id[far])
    edges[near] |= boundary
    edges[far] |= boundary
  return edges
