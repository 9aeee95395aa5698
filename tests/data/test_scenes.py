"""Ray-cast scenes: exact geometry, normals vs depth, distributions, depth edges, TFDS builder."""
import dataclasses
import math
import sys
import time

import numpy as np
import pytest

from jaxlab.data import scenes

LIGHT = np.array([0.0, 0.6, -0.8])


def _scene(*surfaces, ambient=0.3):
  return scenes.Scene(tuple(surfaces), LIGHT, ambient)


def _angles_degrees(a, b):
  cosine = np.sum(a * b, -1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
  return np.degrees(np.arccos(np.clip(cosine, -1, 1)))


@pytest.mark.parametrize("distribution", ["train", "heldout"])
def test_shapes_dtypes_ranges_and_normals_face_the_camera(distribution):
  batch = scenes.render_scenes(24, seed=1, distribution=distribution)
  assert batch["image"].shape == (24, 32, 32, 3) and batch["image"].dtype == np.float32
  assert batch["depth"].shape == (24, 32, 32) and batch["depth"].dtype == np.float32
  assert batch["normal"].shape == (24, 32, 32, 3) and batch["normal"].dtype == np.float32
  assert batch["object_id"].shape == (24, 32, 32) and batch["object_id"].dtype == np.int32
  assert batch["image"].min() >= 0 and batch["image"].max() <= 1
  assert batch["image"].std() > 0.05
  assert np.all(np.isfinite(batch["depth"])) and batch["depth"].min() > 1.0
  assert batch["depth"].max() <= scenes.WALL_DEPTH_RANGE[1]
  np.testing.assert_allclose(np.linalg.norm(batch["normal"], axis=-1), 1, atol=1e-5)
  rays = scenes.camera_rays(32)
  assert np.all(np.sum(batch["normal"] * rays, -1) < 0)
  ids = batch["object_id"]
  assert ids.min() == 0 and 2 <= ids.max() <= 5
  assert all({0, 1} <= set(np.unique(scene_ids)) and scene_ids.max() >= 2 for scene_ids in ids)


def test_camera_rays_follow_the_pinhole_model():
  rays = scenes.camera_rays(4, fov_degrees=90.0)   # tan(45) = 1: pixel centres at +-0.25, +-0.75
  np.testing.assert_allclose(rays[0, 0], [-0.75, 0.75, 1.0])
  np.testing.assert_allclose(rays[3, 2], [0.25, -0.75, 1.0])


def test_ground_plane_depth_normal_and_shading_are_analytic():
  grey = 0.6
  ground = scenes.plane([0, -1, 0], [0, 1, 0], scenes.plain_material([grey] * 3))
  out = scenes.render(_scene(ground, ambient=0.3), size=32, fov_degrees=60.0)
  half_width = math.tan(math.radians(30.0))
  ray_y = (1 - 2 * (np.arange(32) + 0.5) / 32) * half_width     # per row; ray_z = 1
  below = ray_y < 0
  expected_depth = np.broadcast_to((-1 / ray_y * 1.0)[below, None], (below.sum(), 32))
  np.testing.assert_allclose(out["depth"][below], expected_depth, rtol=1e-6)
  np.testing.assert_allclose(out["depth"][31, 16], 1 / (half_width * 31 / 32), rtol=1e-6)
  np.testing.assert_array_equal(out["normal"][below], np.broadcast_to([0, 1, 0], (16, 32, 3)))
  np.testing.assert_array_equal(out["object_id"][below], 0)
  np.testing.assert_allclose(out["image"][below], grey * (0.3 + 0.7 * LIGHT[1]), rtol=1e-6)
  # Above the horizon nothing is hit.
  assert np.all(np.isinf(out["depth"][~below])) and np.all(out["object_id"][~below] == -1)


def test_hits_lie_on_the_analytic_surfaces_with_analytic_normals():
  material = scenes.plain_material()
  yaw = 0.6
  rotation = np.array([[math.cos(yaw), 0, math.sin(yaw)], [0, 1, 0],
                       [-math.sin(yaw), 0, math.cos(yaw)]])
  center = np.array([0.3, -0.2, 4.0])
  cases = {
      "sphere": scenes.sphere(center, 0.9, material),
      "box": scenes.box([0.3, -0.9, 4.0], [0.8, 0.5, 0.6], material, yaw),   # top in view
      "cylinder": scenes.cylinder([0.3, -0.9, 4.0], 0.7, 0.6, material),   # top cap visible
      "ellipsoid": scenes.ellipsoid(center, [1.0, 0.5, 0.7], material, yaw),
  }
  wall = scenes.plane([0, 0, 9], [0, 0, -1], material)
  rays = scenes.camera_rays(48)
  for kind, surface in cases.items():
    out = scenes.render(_scene(wall, surface), size=48)
    hit = out["object_id"] == 1
    assert 150 < hit.sum() < 48 * 48 / 2, kind
    points = out["depth"][hit, None].astype(np.float64) * rays[hit]
    local = (points - surface.center) @ rotation if kind in ("box", "ellipsoid") else (
        points - surface.center)
    if kind == "sphere":
      np.testing.assert_allclose(np.linalg.norm(local, axis=-1), 0.9, rtol=1e-5)
      expected = local
    elif kind == "box":
      scaled = np.abs(local) / surface.extent
      np.testing.assert_allclose(scaled.max(-1), 1, rtol=1e-5)
      face = scaled.argmax(-1)
      expected = np.zeros_like(local)
      expected[np.arange(len(local)), face] = np.sign(local[np.arange(len(local)), face])
      expected = expected @ rotation.T
      assert len(np.unique(face)) == 3      # three faces in view: both yaw and tilt work
    elif kind == "cylinder":
      radial = np.hypot(local[:, 0], local[:, 2])
      on_side = np.isclose(radial, 0.7, rtol=1e-5)
      on_top = np.isclose(local[:, 1], 0.6, rtol=1e-5)
      assert np.all(on_side | on_top) and on_side.any() and on_top.any()
      assert np.all(radial <= 0.7 + 1e-5) and np.all(np.abs(local[:, 1]) <= 0.6 + 1e-5)
      expected = np.where(on_top[:, None], [0.0, 1.0, 0.0], local * [1, 0, 1])
    else:
      np.testing.assert_allclose(np.linalg.norm(local / surface.extent, axis=-1), 1, rtol=1e-5)
      expected = (local / surface.extent ** 2) @ rotation.T
    angles = _angles_degrees(out["normal"][hit], expected)
    assert np.percentile(angles, 99) < 0.05 and angles.max() < 1.0, (kind, angles.max())
    # The silhouette is right too: rays that miss the object reach the wall.
    assert np.all(out["depth"][~hit] == 9.0)


@pytest.mark.parametrize("distribution", ["train", "heldout"])
def test_normals_agree_with_finite_differences_of_depth(distribution):
  size = 64
  rays = scenes.camera_rays(size)
  angles = {}
  for i in range(12):
    scene = scenes.sample_scene(scenes.scene_rng(11, i), distribution)
    out = scenes.render(scene, size=size)
    points = out["depth"][..., None].astype(np.float64) * rays   # depth * ray / ray_z
    # Columns go right (+x), rows go down (-y): this cross product faces the camera.
    normal = np.cross(points[1:-1, 2:] - points[1:-1, :-2], points[2:, 1:-1] - points[:-2, 1:-1])
    ids, edges = out["object_id"], scenes.depth_edges(out["depth"])
    smooth = np.ones((size - 2, size - 2), bool)
    for dr in range(3):
      for dc in range(3):
        window = (slice(dr, dr + size - 2), slice(dc, dc + size - 2))
        smooth &= (ids[window] == ids[1:-1, 1:-1]) & ~edges[window]
    error = _angles_degrees(normal, out["normal"][1:-1, 1:-1])
    for index, surface in enumerate(scene.surfaces):
      chosen = smooth & (ids[1:-1, 1:-1] == index)
      angles.setdefault(surface.kind, []).append(error[chosen])
  expected_kinds = {"train": {"plane", "sphere", "box"},
                    "heldout": {"plane", "cylinder", "ellipsoid"}}[distribution]
  assert set(angles) == expected_kinds
  for kind, values in angles.items():
    values = np.concatenate(values)
    assert len(values) > 500, kind
    # Box creases (two faces in one 3x3 window) are the only large disagreements.
    assert np.median(values) < 5 and np.percentile(values, 95) < 15, kind


def test_scenes_are_deterministic_in_the_seed():
  first = scenes.render_scenes(3, seed=5)
  again = scenes.render_scenes(3, seed=5)
  for name in first:
    np.testing.assert_array_equal(first[name], again[name])
  prefix = scenes.render_scenes(2, seed=5)
  np.testing.assert_array_equal(prefix["image"], first["image"][:2])
  other = scenes.render_scenes(3, seed=6)
  assert all(not np.array_equal(other["depth"][i], first["depth"][i]) for i in range(3))
  depths = [first["depth"][i].tobytes() for i in range(3)] + [other["depth"][0].tobytes()]
  assert len(set(depths)) == 4
  one = scenes.render_scene(scenes.scene_rng(5, 2))
  np.testing.assert_array_equal(one["normal"], first["normal"][2])


def test_lambertian_shading_with_ambient_and_pixel_noise():
  colour = np.array([0.9, 0.5, 0.2])
  light = np.array([0.8, 0.3, -0.2]) / np.linalg.norm([0.8, 0.3, -0.2])
  wall = scenes.plane([0, 0, 8], [0, 0, -1], scenes.plain_material(colour))
  ball = scenes.sphere([0.0, 0.0, 4.0], 1.2, scenes.plain_material(colour))
  scene = scenes.Scene((wall, ball), light, ambient=0.25)
  out = scenes.render(scene, size=32)
  facing = np.sum(out["normal"] * light, -1)
  assert (facing < 0).sum() > 50      # the sphere's far side is in shade
  expected = colour * (0.25 + 0.75 * np.maximum(facing, 0))[..., None]
  np.testing.assert_allclose(out["image"], expected, rtol=1e-6)
  noisy = scenes.render(dataclasses.replace(scene, noise_std=0.02), size=32,
                        rng=np.random.default_rng(0))
  assert abs(np.std(noisy["image"] - out["image"]) - 0.02) < 0.002
  np.testing.assert_array_equal(noisy["depth"], out["depth"])


@pytest.mark.parametrize("texture", ["checker", "stripes", "noise"])
def test_textures_mix_two_colours(texture):
  colour, accent = np.array([0.8, 0.2, 0.2]), np.array([0.1, 0.3, 0.9])
  material = scenes.Material(colour, accent, texture, 0.5, np.array([0.3, 0.1, 0.7]),
                             stripe_axis=np.array([1.0, 0.0, 0.0]),
                             noise_table=np.random.default_rng(0).uniform(0, 1, (8, 8, 8)))
  wall = scenes.plane([0, 0, 6], [0, 0, -1], material)
  image = scenes.render(scenes.Scene((wall,), np.array([0.0, 0.0, -1.0]), 0.5), size=32)["image"]
  pixels = image.reshape(-1, 3).astype(np.float64)
  # Fully lit (normal . light = 1), so pixel = (1 - tau) * colour + tau * accent exactly.
  tau = (pixels - colour) @ (accent - colour) / np.sum((accent - colour) ** 2)
  np.testing.assert_allclose(pixels, colour + tau[:, None] * (accent - colour), atol=1e-6)
  assert tau.min() >= -1e-6 and tau.max() <= 1 + 1e-6
  levels = np.unique(np.round(tau, 5))
  if texture == "noise":
    assert len(levels) > 500 and tau.std() > 0.05
  else:
    np.testing.assert_allclose(levels, [0, 1], atol=1e-5)
    assert 0.3 < tau.mean() < 0.7
  if texture == "stripes":     # stripes across x: every column is one colour
    np.testing.assert_array_equal(image, np.broadcast_to(image[:1], image.shape))


def _saturation(images):
  return (images.max(-1) - images.min(-1)).mean()


def test_heldout_draws_other_shapes_textures_colours_and_light():
  drawn = {}
  for distribution in ("train", "heldout"):
    kinds, textures, elevations = set(), set(), []
    for i in range(60):
      scene = scenes.sample_scene(scenes.scene_rng(0, i), distribution)
      kinds |= {surface.kind for surface in scene.surfaces}
      textures |= {surface.material.texture for surface in scene.surfaces}
      elevations.append(math.degrees(math.asin(scene.light[1])))
      assert scene.light[1] > 0 and scene.light[2] < 0
    drawn[distribution] = kinds, textures, np.array(elevations)
  assert drawn["train"][0] == {"plane", "sphere", "box"}
  assert drawn["heldout"][0] == {"plane", "cylinder", "ellipsoid"}
  assert drawn["train"][1] == {"checker", "stripes"} and drawn["heldout"][1] == {"noise"}
  assert drawn["train"][2].min() >= 30 and drawn["heldout"][2].max() <= 30
  train = scenes.render_scenes(40, seed=0, distribution="train")
  heldout = scenes.render_scenes(40, seed=0, distribution="heldout")
  assert _saturation(heldout["image"]) < 0.6 * _saturation(train["image"])
  with pytest.raises(ValueError, match="distribution"):
    scenes.render_scene(np.random.default_rng(0), distribution="test")


def test_depth_edges_outline_a_sphere_in_front_of_a_wall():
  material = scenes.plain_material()
  wall = scenes.plane([0, 0, 8], [0, 0, -1], material)
  ball = scenes.sphere([0.2, 0.1, 4.0], 1.0, material)
  out = scenes.render(_scene(wall, ball), size=32)
  edges = scenes.depth_edges(out["depth"])
  on_ball = out["object_id"] == 1
  padded = np.pad(on_ball, 1, mode="edge")
  neighbours = [padded[:-2, 1:-1], padded[2:, 1:-1], padded[1:-1, :-2], padded[1:-1, 2:]]
  boundary = np.zeros_like(on_ball)
  for neighbour in neighbours:
    boundary |= neighbour != on_ball
  assert 30 < boundary.sum() < 200
  np.testing.assert_array_equal(edges, boundary)
  # Leading axes are batch axes.
  stacked = scenes.depth_edges(np.stack([out["depth"], np.full((32, 32), 5.0)]))
  np.testing.assert_array_equal(stacked[0], edges)
  assert not stacked[1].any()


def test_depth_edges_leave_plane_interiors_alone():
  material = scenes.plain_material()
  tilted = scenes.plane([0, 0, 5], [0.3, 0.4, -1], material)
  assert not scenes.depth_edges(scenes.render(_scene(tilted), size=32)["depth"]).any()
  ground = scenes.plane([0, -1, 0], [0, 1, 0], material)
  edges = scenes.depth_edges(scenes.render(_scene(ground), size=32)["depth"])
  # Row k below the horizon has depth ~ 1 / (k + 1/2): the jump to row k + 1 is 1 / (k + 1/2),
  # over 0.1 only within 10 rows of the horizon (grazing view). Nearer ground is never marked.
  rows_below = np.arange(16)
  near_horizon = rows_below <= 10
  assert np.all(edges[16:][near_horizon]) and not np.any(edges[16:][~near_horizon])


def test_rendering_is_fast():
  scenes.render_scenes(5, seed=0)
  start = time.perf_counter()
  scenes.render_scenes(200, seed=0)
  scenes.render_scenes(200, seed=0, distribution="heldout")
  assert (time.perf_counter() - start) / 400 < 0.01   # typically 1-3 ms a scene


def test_builder_stores_render_scenes_in_order(tmp_path):
  config = scenes.scenes_config(distribution="heldout", size=16, num_train=8, num_test=4, seed=3)
  assert config.name == "heldout_16px_train8_test4_seed3"
  train = scenes.load_arrays("train", config, str(tmp_path))
  test = scenes.load_arrays("test", config, str(tmp_path))
  assert "tensorflow" not in sys.modules
  assert list(tmp_path.rglob("*.array_record*"))
  # Train is seed 2 * 3 = 6, test 2 * 3 + 1 = 7.
  expected_train = scenes.render_scenes(8, seed=6, size=16, distribution="heldout")
  expected_test = scenes.render_scenes(4, seed=7, size=16, distribution="heldout")
  assert set(train) == set(expected_train)
  for name in expected_train:
    assert train[name].dtype == expected_train[name].dtype
    np.testing.assert_array_equal(train[name], expected_train[name])
    np.testing.assert_array_equal(test[name], expected_test[name])
  again = scenes.load_arrays("test", config, str(tmp_path))
  np.testing.assert_array_equal(again["depth"], test["depth"])
