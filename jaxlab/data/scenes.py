"""Procedurally rendered scenes with exact depth and surface normals, as a TFDS dataset.

A monocular depth and normal estimator (Lotus, at 32x32) needs images paired with per-pixel
geometry that is exactly right, and a second, shifted distribution to test it zero-shot. Here
both come from ray casting analytic shapes in numpy, so the ground truth is exact up to float
rounding, nothing is downloaded, and a 32x32 scene takes a few milliseconds.

Camera: a pinhole at the origin looking along +z, x to the right, y up; one ray per pixel centre
(row 0 is the top row). Rays are kept with ray_z = 1, so the ray parameter of a hit IS its depth.

    depth     camera-space z of the nearest hit (not the ray length), > 0
    normal    unit surface normal in camera coordinates, facing the camera: dot(normal, ray) < 0
    object_id index of the hit surface in the scene: 0 ground, 1 back wall, 2.. objects
    image     albedo * (ambient + (1 - ambient) * max(0, normal . light)), + noise, clipped to
              [0, 1]; no cast shadows, no specular

Every scene has a ground plane (y = -1, facing up), a back wall (z uniform in [6, 10], facing
the camera; it covers the whole view, so every pixel hits something) and 1-4 objects standing on
the ground in front of the wall, with their centres inside the central 80% of the view.

Two distributions (see `DISTRIBUTIONS`):

    train    spheres and boxes (rotated about the vertical axis); checkerboard and stripe
             textures; saturated colours, each texture mixing a colour with a darker shade of it;
             light 30-70 degrees above the horizon within 50 degrees of the camera axis;
             ambient 0.25-0.45.
    heldout  vertical cylinders and ellipsoids (rotated about the vertical axis); smooth value
             noise mixing two unrelated colours; muted, darker colours; a low, raking light
             10-30 degrees above the horizon and up to 80 degrees off the camera axis;
             ambient 0.1-0.25.

Neither shape family nor texture appears in the other distribution, so `heldout` tests
zero-shot generalisation over geometry and appearance at once. Both use pixel noise of std 0.01.

Seeding: scene `i` of `render_scenes(num, seed=s)` is drawn from its own generator
`scene_rng(s, i)`, so the first k scenes do not depend on `num`. The TFDS builder writes the
`train` split as `render_scenes(num_train, seed=split_seed(seed, "train"))` (= 2 * seed) and the
`test` split from `split_seed(seed, "test")` (= 2 * seed + 1), so splits never share a stream,
and keeps that order on disk.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import tensorflow_datasets as tfds

from jaxlab.data import pipeline

FOV_DEGREES = 60.0             # the builder's field of view
GROUND_Y = -1.0
WALL_DEPTH_RANGE = (6.0, 10.0)
SHAPE_KINDS = ("plane", "sphere", "box", "cylinder", "ellipsoid")
TEXTURE_KINDS = ("checker", "stripes", "noise")
MISS_ID = -1                   # object_id of a pixel that hits nothing (hand-built scenes only)
_EPS = 1e-6                    # hits this close to the camera (or behind it) do not count
_NOISE_LATTICE = 8             # value-noise lattice period, in texture cells


# ----------------------------------------------------------------------------- scene description


@dataclasses.dataclass(frozen=True)
class Material:
  """A two-colour procedural texture: albedo = (1 - tau) * colour + tau * accent."""
  colour: np.ndarray               # [3] in [0, 1]
  accent: np.ndarray               # [3] in [0, 1]
  texture: str                     # one of TEXTURE_KINDS
  scale: float                     # texture cell size, in scene units
  phase: np.ndarray                # [3] offset of the pattern, in cells
  stripe_axis: np.ndarray | None = None     # [3] unit, stripes only
  noise_table: np.ndarray | None = None     # [L, L, L] lattice values in [0, 1], noise only


@dataclasses.dataclass(frozen=True)
class Surface:
  """One analytic surface. `extent` is per kind:

      plane      unit normal (the surface is {p : (p - center) . extent = 0}, seen from both sides)
      sphere     [radius]
      box        [3] half sizes along the box's own axes
      cylinder   [radius, half height] (axis vertical)
      ellipsoid  [3] radii along its own axes

  `yaw` rotates boxes and ellipsoids about the vertical axis through `center`.
  """
  kind: str
  center: np.ndarray
  extent: np.ndarray
  material: Material
  yaw: float = 0.0


@dataclasses.dataclass(frozen=True)
class Scene:
  surfaces: tuple[Surface, ...]    # object_id indexes this
  light: np.ndarray                # [3] unit vector towards the (directional) light
  ambient: float
  noise_std: float = 0.0


@dataclasses.dataclass(frozen=True)
class SceneDistribution:
  """The random choices that differ between `train` and `heldout` (ranges are uniform)."""
  shapes: tuple[str, ...]
  textures: tuple[str, ...]
  saturation: tuple[float, float]
  value: tuple[float, float]
  accent: str                      # "shade": darker copy of the colour; "palette": a 2nd colour
  light_elevation_degrees: tuple[float, float]   # above the horizon
  light_azimuth_degrees: float     # largest angle off the direction back towards the camera
  ambient: tuple[float, float]
  noise_std: float = 0.01
  num_objects: tuple[int, int] = (1, 4)


DISTRIBUTIONS = {
    "train": SceneDistribution(
        shapes=("sphere", "box"), textures=("checker", "stripes"), saturation=(0.45, 0.9),
        value=(0.55, 1.0), accent="shade", light_elevation_degrees=(30.0, 70.0),
        light_azimuth_degrees=50.0, ambient=(0.25, 0.45)),
    "heldout": SceneDistribution(
        shapes=("cylinder", "ellipsoid"), textures=("noise",), saturation=(0.1, 0.35),
        value=(0.35, 0.75), accent="palette", light_elevation_degrees=(10.0, 30.0),
        light_azimuth_degrees=80.0, ambient=(0.1, 0.25)),
}


def _yaw_matrix(yaw: float) -> np.ndarray:
  """Object-to-camera rotation about the vertical (y) axis."""
  c, s = math.cos(yaw), math.sin(yaw)
  return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def plane(point, normal, material: Material) -> Surface:
  normal = np.asarray(normal, np.float64)
  return Surface("plane", np.asarray(point, np.float64), normal / np.linalg.norm(normal),
                 material)


def sphere(center, radius: float, material: Material) -> Surface:
  return Surface("sphere", np.asarray(center, np.float64), np.array([radius], np.float64),
                 material)


def box(center, half_sizes, material: Material, yaw: float = 0.0) -> Surface:
  return Surface("box", np.asarray(center, np.float64), np.asarray(half_sizes, np.float64),
                 material, yaw)


def cylinder(center, radius: float, half_height: float, material: Material) -> Surface:
  return Surface("cylinder", np.asarray(center, np.float64),
                 np.array([radius, half_height], np.float64), material)


def ellipsoid(center, radii, material: Material, yaw: float = 0.0) -> Surface:
  return Surface("ellipsoid", np.asarray(center, np.float64), np.asarray(radii, np.float64),
                 material, yaw)


def plain_material(colour=(0.7, 0.7, 0.7)) -> Material:
  """An untextured material (a checker whose two colours are equal), for hand-built scenes."""
  colour = np.asarray(colour, np.float64)
  return Material(colour, colour, "checker", 1.0, np.zeros(3))


# ----------------------------------------------------------------------------- ray casting


def camera_rays(size: int, fov_degrees: float = FOV_DEGREES) -> np.ndarray:
  """[size, size, 3] pixel-centre ray directions with z = 1 (so ray parameter = depth)."""
  half_width = math.tan(math.radians(fov_degrees) / 2)
  centres = (np.arange(size) + 0.5) / size * 2 - 1
  x = np.broadcast_to(centres[None, :], (size, size)) * half_width
  y = np.broadcast_to(-centres[:, None], (size, size)) * half_width
  return np.stack([x, y, np.ones((size, size))], axis=-1)


def _nonzero(values: np.ndarray) -> np.ndarray:
  # A ray exactly parallel to a slab would give 0 * inf = nan at its boundary.
  return np.where(values == 0, 1e-30, values)


def _intersect(surface: Surface, rays: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(ray parameter [N], inf on a miss; unit normal [N, 3]) of rays [N, 3] from the origin."""
  center, extent = surface.center, surface.extent
  with np.errstate(divide="ignore", invalid="ignore"):
    if surface.kind == "plane":
      facing = rays @ extent
      t = np.where(facing != 0, (center @ extent) / _nonzero(facing), np.inf)
      # Planes are two-sided: the visible side is the one facing the camera.
      normal = -np.sign(facing)[:, None] * extent
    elif surface.kind == "sphere":
      half_b = rays @ -center
      a = np.einsum("nd,nd->n", rays, rays)
      c = center @ center - extent[0] ** 2
      disc = half_b ** 2 - a * c
      t = np.where(disc >= 0, (-half_b - np.sqrt(disc)) / a, np.inf)
      normal = (t[:, None] * rays - center) / extent[0]
    elif surface.kind == "box":
      rotation = _yaw_matrix(surface.yaw)
      direction, origin = rays @ rotation, -center @ rotation     # in the box's frame
      inverse = 1 / _nonzero(direction)
      near_planes = (-extent - origin) * inverse
      far_planes = (extent - origin) * inverse
      entry = np.minimum(near_planes, far_planes)
      t_near = entry.max(-1)
      t_far = np.maximum(near_planes, far_planes).min(-1)
      t = np.where(t_near <= t_far, t_near, np.inf)
      axis = entry.argmax(-1)
      local_normal = np.zeros_like(rays)
      rows = np.arange(len(rays))
      local_normal[rows, axis] = -np.sign(direction[rows, axis])
      normal = local_normal @ rotation.T
    elif surface.kind == "cylinder":
      radius, half_height = extent
      dx, dy, dz = rays.T
      ox, oz = -center[0], -center[2]
      a = dx ** 2 + dz ** 2
      half_b = dx * ox + dz * oz
      disc = half_b ** 2 - a * (ox ** 2 + oz ** 2 - radius ** 2)
      t_side = (-half_b - np.sqrt(disc)) / a
      t_side = np.where((disc >= 0) & (np.abs(t_side * dy - center[1]) <= half_height),
                        t_side, np.inf)
      candidates, normals = [t_side], [None]
      for sign in (1.0, -1.0):
        t_cap = (center[1] + sign * half_height) / _nonzero(dy)
        radial = (t_cap * dx + ox) ** 2 + (t_cap * dz + oz) ** 2
        candidates.append(np.where(radial <= radius ** 2, t_cap, np.inf))
        normals.append(np.array([0.0, sign, 0.0]))
      candidates = np.stack(candidates)
      candidates = np.where(candidates > _EPS, candidates, np.inf)
      which = candidates.argmin(0)
      t = candidates[which, np.arange(len(rays))]
      side = t[:, None] * rays - center
      side[:, 1] = 0
      normals[0] = side / radius
      normal = np.select([which[:, None] == k for k in range(3)],
                         [np.broadcast_to(n, rays.shape) for n in normals])
    elif surface.kind == "ellipsoid":
      rotation = _yaw_matrix(surface.yaw)
      # In coordinates scaled by the radii the ellipsoid is the unit sphere.
      direction, origin = rays @ rotation / extent, -center @ rotation / extent
      a = np.einsum("nd,nd->n", direction, direction)
      half_b = direction @ origin
      disc = half_b ** 2 - a * (origin @ origin - 1)
      t = np.where(disc >= 0, (-half_b - np.sqrt(disc)) / a, np.inf)
      unit_point = origin + t[:, None] * direction
      # The gradient of |x / r|^2 is 2 x / r^2 = 2 (unit point) / r.
      normal = (unit_point / extent) @ rotation.T
    else:
      raise ValueError(f"unknown surface kind {surface.kind!r}")
    t = np.where(np.isfinite(t) & (t > _EPS), t, np.inf)
    normal = np.where(np.isfinite(t)[:, None], normal, 0.0)
  length = np.linalg.norm(normal, axis=-1, keepdims=True)
  return t, normal / np.where(length > 0, length, 1)


_CUBE_CORNERS = np.array(list(np.ndindex(2, 2, 2)))   # [8, 3]


def _value_noise(points: np.ndarray, table: np.ndarray) -> np.ndarray:
  """Smoothly interpolated random lattice values at points [N, 3] (lattice wraps around)."""
  cell = np.floor(points)
  fraction = points - cell
  weight = fraction * fraction * (3 - 2 * fraction)    # smoothstep: no creases at cell faces
  corners = (cell.astype(np.int64)[:, None, :] + _CUBE_CORNERS) % len(table)   # [N, 8, 3]
  corner_weights = np.where(_CUBE_CORNERS == 1, weight[:, None, :],
                            1 - weight[:, None, :]).prod(-1)
  size = len(table)
  values = table.ravel()[(corners[..., 0] * size + corners[..., 1]) * size + corners[..., 2]]
  return np.sum(corner_weights * values, axis=-1)


def _albedo(material: Material, local_points: np.ndarray) -> np.ndarray:
  """[N, 3] texture colours at points [N, 3] in the surface's own frame."""
  cells = local_points / material.scale + material.phase
  if material.texture == "checker":
    mix = np.floor(cells).sum(-1) % 2
  elif material.texture == "stripes":
    mix = np.floor(cells @ material.stripe_axis) % 2
  elif material.texture == "noise":
    # Two octaves: broad blotches plus finer grain.
    coarse, fine = np.split(
        _value_noise(np.concatenate([cells, 2 * cells + 0.5]), material.noise_table), 2)
    mix = 0.65 * coarse + 0.35 * fine
  else:
    raise ValueError(f"unknown texture {material.texture!r}")
  mix = mix[:, None]
  return (1 - mix) * material.colour + mix * material.accent


def render(scene: Scene, *, size: int = 32, fov_degrees: float = FOV_DEGREES,
           rng: np.random.Generator | None = None) -> dict[str, np.ndarray]:
  """Ray casts a scene: image, depth, normal, object_id (see the module docstring).

  Pixel noise is added only when `rng` is given. Pixels that hit nothing (possible only in
  hand-built scenes without a wall) get depth inf, normal 0, object_id MISS_ID and image 0.
  """
  rays = camera_rays(size, fov_degrees).reshape(-1, 3)
  hits = [_intersect(surface, rays) for surface in scene.surfaces]
  distances = np.stack([t for t, _ in hits])
  nearest = distances.argmin(0)
  pixels = np.arange(len(rays))
  depth = distances[nearest, pixels]
  missed = ~np.isfinite(depth)
  normal = np.stack([n for _, n in hits])[nearest, pixels]
  normal[missed] = 0
  object_id = np.where(missed, MISS_ID, nearest)

  albedo = np.zeros_like(rays)
  for index, surface in enumerate(scene.surfaces):
    mine = object_id == index
    if not mine.any():
      continue
    points = depth[mine, None] * rays[mine]
    if surface.kind != "plane":
      # Objects carry their texture with them; planes use camera coordinates.
      points = (points - surface.center) @ _yaw_matrix(surface.yaw)
    albedo[mine] = _albedo(surface.material, points)
  lambert = np.maximum(0.0, normal @ scene.light)
  image = albedo * (scene.ambient + (1 - scene.ambient) * lambert)[:, None]
  if rng is not None and scene.noise_std > 0:
    image = image + rng.normal(0.0, scene.noise_std, image.shape)
  image[missed] = 0
  return {"image": np.clip(image, 0, 1).reshape(size, size, 3).astype(np.float32),
          "depth": depth.reshape(size, size).astype(np.float32),
          "normal": normal.reshape(size, size, 3).astype(np.float32),
          "object_id": object_id.reshape(size, size).astype(np.int32)}


# ----------------------------------------------------------------------------- random scenes


def _hsv_to_rgb(hue: float, saturation: float, value: float) -> np.ndarray:
  channel = (np.array([5.0, 3.0, 1.0]) + hue * 6) % 6
  return value - value * saturation * np.clip(np.minimum(channel, 4 - channel), 0, 1)


def _sample_colour(rng: np.random.Generator, spec: SceneDistribution) -> np.ndarray:
  return _hsv_to_rgb(rng.uniform(), rng.uniform(*spec.saturation), rng.uniform(*spec.value))


def _sample_material(rng: np.random.Generator, spec: SceneDistribution, scale_range
                     ) -> Material:
  colour = _sample_colour(rng, spec)
  accent = (colour * rng.uniform(0.3, 0.6) if spec.accent == "shade"
            else _sample_colour(rng, spec))
  texture = spec.textures[rng.integers(len(spec.textures))]
  # A random phase keeps cell boundaries off the flat faces the pattern is evaluated on.
  phase = rng.uniform(0, 1, 3)
  axis = rng.normal(size=3)
  table = (rng.uniform(0, 1, (_NOISE_LATTICE,) * 3) if texture == "noise" else None)
  return Material(colour, accent, texture, float(rng.uniform(*scale_range)), phase,
                  axis / np.linalg.norm(axis) if texture == "stripes" else None, table)


def _sample_object(rng: np.random.Generator, spec: SceneDistribution, wall_depth: float,
                   half_width: float) -> Surface:
  kind = spec.shapes[rng.integers(len(spec.shapes))]
  # Every shape's horizontal reach is below 1.2, so depth <= wall - 1.6 keeps it off the wall;
  # depth <= 6 keeps it a few pixels across even at 32x32.
  z = rng.uniform(2.5, min(6.0, wall_depth - 1.6))
  x = rng.uniform(-0.8, 0.8) * z * half_width
  material = _sample_material(rng, spec, (0.2, 0.5))
  yaw = float(rng.uniform(0, math.pi))
  # Objects stand on the ground: their lowest point is at y = GROUND_Y.
  if kind == "sphere":
    radius = rng.uniform(0.35, 0.9)
    return sphere([x, GROUND_Y + radius, z], radius, material)
  if kind == "box":
    half_sizes = rng.uniform(0.25, 0.8, 3)
    return box([x, GROUND_Y + half_sizes[1], z], half_sizes, material, yaw)
  if kind == "cylinder":
    radius, half_height = rng.uniform(0.25, 0.7), rng.uniform(0.3, 1.0)
    return cylinder([x, GROUND_Y + half_height, z], radius, half_height, material)
  if kind == "ellipsoid":
    radii = rng.uniform(0.25, 0.85, 3)
    return ellipsoid([x, GROUND_Y + radii[1], z], radii, material, yaw)
  raise ValueError(f"unknown shape {kind!r}")


def sample_scene(rng: np.random.Generator, distribution: str | SceneDistribution = "train",
                 fov_degrees: float = FOV_DEGREES) -> Scene:
  """A random scene: ground (id 0), back wall (id 1) and 1-4 objects (ids 2..); `distribution`
  names one of DISTRIBUTIONS or is a SceneDistribution."""
  if isinstance(distribution, SceneDistribution):
    spec = distribution
  elif distribution in DISTRIBUTIONS:
    spec = DISTRIBUTIONS[distribution]
  else:
    raise ValueError(f"unknown distribution {distribution!r}; have {sorted(DISTRIBUTIONS)}")
  half_width = math.tan(math.radians(fov_degrees) / 2)
  wall_depth = float(rng.uniform(*WALL_DEPTH_RANGE))
  surfaces = [plane([0, GROUND_Y, 0], [0, 1, 0], _sample_material(rng, spec, (0.5, 1.5))),
              plane([0, 0, wall_depth], [0, 0, -1], _sample_material(rng, spec, (0.5, 1.5)))]
  low, high = spec.num_objects
  for _ in range(rng.integers(low, high + 1)):
    surfaces.append(_sample_object(rng, spec, wall_depth, half_width))
  elevation = math.radians(rng.uniform(*spec.light_elevation_degrees))
  azimuth = math.radians(rng.uniform(-1, 1) * spec.light_azimuth_degrees)
  # Azimuth 0 points back at the camera (-z): lit faces are the ones the camera sees.
  light = np.array([math.cos(elevation) * math.sin(azimuth), math.sin(elevation),
                    -math.cos(elevation) * math.cos(azimuth)])
  return Scene(tuple(surfaces), light, float(rng.uniform(*spec.ambient)), spec.noise_std)


def render_scene(rng: np.random.Generator, *, size: int = 32, distribution: str = "train",
                 fov_degrees: float = FOV_DEGREES) -> dict[str, np.ndarray]:
  """A random scene, rendered: image [size, size, 3] float32 in [0, 1], depth [size, size]
  float32 > 0, normal [size, size, 3] float32 unit, object_id [size, size] int32."""
  scene = sample_scene(rng, distribution, fov_degrees)
  return render(scene, size=size, fov_degrees=fov_degrees, rng=rng)


def scene_rng(seed: int, index: int) -> np.random.Generator:
  """The generator of scene `index` under `seed` (independent streams for every pair)."""
  return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(index,)))


def render_scenes(num: int, *, seed: int, size: int = 32, distribution: str = "train",
                  fov_degrees: float = FOV_DEGREES) -> dict[str, np.ndarray]:
  """`num` scenes stacked on a leading axis; scene i comes from `scene_rng(seed, i)`."""
  scenes = [render_scene(scene_rng(seed, i), size=size, distribution=distribution,
                         fov_degrees=fov_degrees) for i in range(num)]
  return {name: np.stack([s[name] for s in scenes]) for name in scenes[0]}


def depth_edges(depth: np.ndarray, threshold: float = 0.1) -> np.ndarray:
  """Bool [..., H, W]: pixels whose depth differs from a 4-neighbour's by more than `threshold`
  relative to the nearer of the two. Both sides of a discontinuity are marked.

  The criterion is purely local, so a plane seen at a grazing angle (the ground far away, at
  low resolution) is marked too once its own depth changes by more than `threshold` per pixel:
  on the ground that happens within about 1 / threshold rows of the horizon.
  """
  depth = np.asarray(depth, np.float64)
  edges = np.zeros(depth.shape, bool)
  with np.errstate(invalid="ignore", divide="ignore"):
    for axis in (-1, -2):
      ahead = np.take(depth, np.arange(1, depth.shape[axis]), axis=axis)
      behind = np.take(depth, np.arange(depth.shape[axis] - 1), axis=axis)
      jump = np.abs(ahead - behind) / np.minimum(ahead, behind) > threshold
      pad_after = [(0, 0)] * depth.ndim
      pad_before = [(0, 0)] * depth.ndim
      pad_after[axis], pad_before[axis] = (0, 1), (1, 0)
      edges |= np.pad(jump, pad_after) | np.pad(jump, pad_before)
  return edges


# ----------------------------------------------------------------------------- style transfer

SEMANTIC_CLASSES = ("ground", "wall", "object")


def semantic_classes(object_id: np.ndarray) -> np.ndarray:
  """object_id [..., H, W] -> the semantic class per pixel: 0 ground, 1 wall, 2 any object."""
  object_id = np.asarray(object_id)
  return np.where(object_id >= 2, 2, object_id).astype(np.int32)


def restyle(context: Scene, reference: Scene) -> Scene:
  """The context's geometry and light with the reference's materials by semantic class: its
  ground, its wall, and for object k of the context the reference's object k (its last object
  when it has fewer; a one-object reference styles every object alike)."""
  if len(reference.surfaces) < 3:
    raise ValueError("the reference needs a ground, a wall and at least one object")
  last = len(reference.surfaces) - 1
  surfaces = tuple(dataclasses.replace(
      surface, material=reference.surfaces[min(index, last)].material)
      for index, surface in enumerate(context.surfaces))
  return dataclasses.replace(context, surfaces=surfaces)


def semantix_pairs(num: int, seed: int, *, size: int = 32, distribution: str = "train"
                   ) -> dict[str, np.ndarray]:
  """`num` (context, reference) pairs for semantic style transfer, stacked on a leading axis.

  The context has 1-3 objects, the reference one, placed and sized independently. Keys:
  `context`, `reference`, `ideal` ([num, size, size, 3] in [0, 1]; `ideal` is
  render(restyle(context, reference)) without pixel noise: the exact answer) and
  `context_classes`, `reference_classes` ([num, size, size] `semantic_classes`). Pair i comes
  from `scene_rng(seed, i)`, so the first k pairs do not depend on `num`.
  """
  spec = DISTRIBUTIONS[distribution]
  context_spec = dataclasses.replace(spec, num_objects=(1, 3))
  reference_spec = dataclasses.replace(spec, num_objects=(1, 1))
  rows = []
  for index in range(num):
    rng = scene_rng(seed, index)
    context = sample_scene(rng, context_spec)
    reference = sample_scene(rng, reference_spec)
    ctx, ref = render(context, size=size, rng=rng), render(reference, size=size, rng=rng)
    rows.append({"context": ctx["image"], "reference": ref["image"],
                 "ideal": render(restyle(context, reference), size=size)["image"],
                 "context_classes": semantic_classes(ctx["object_id"]),
                 "reference_classes": semantic_classes(ref["object_id"])})
  return {name: np.stack([r[name] for r in rows]) for name in rows[0]}


# ----------------------------------------------------------------------------- TFDS builder


@dataclasses.dataclass
class ScenesConfig(tfds.core.BuilderConfig):
  distribution: str = "train"
  size: int = 32
  num_train: int = 2000
  num_test: int = 200
  seed: int = 0


def scenes_config(*, distribution: str = "train", size: int = 32, num_train: int = 2000,
                  num_test: int = 200, seed: int = 0) -> ScenesConfig:
  """A builder config whose name encodes every parameter (so each variant is cached apart)."""
  if distribution not in DISTRIBUTIONS:
    raise ValueError(f"unknown distribution {distribution!r}; have {sorted(DISTRIBUTIONS)}")
  return ScenesConfig(
      name=f"{distribution}_{size}px_train{num_train}_test{num_test}_seed{seed}",
      distribution=distribution, size=size, num_train=num_train, num_test=num_test, seed=seed)


def split_seed(seed: int, split: str) -> int:
  """The `render_scenes` seed of a split: train 2 * seed, test 2 * seed + 1."""
  return 2 * seed + {"train": 0, "test": 1}[split]


class Scenes(tfds.core.GeneratorBasedBuilder):
  """Ray-cast scenes (ground, wall, 1-4 objects) with exact depth, normals and object ids."""

  VERSION = tfds.core.Version("1.0.0")
  BUILDER_CONFIGS = [scenes_config(), scenes_config(distribution="heldout")]

  def _info(self) -> tfds.core.DatasetInfo:
    size = self.builder_config.size
    # Raw bytes: exact, and cheaper to decode than tf.train.Example's float lists.
    tensor = lambda shape, dtype: tfds.features.Tensor(
        shape=shape, dtype=dtype, encoding=tfds.features.Encoding.BYTES)
    return tfds.core.DatasetInfo(
        builder=self, description=type(self).__doc__,
        # Written in generation order, so a split is render_scenes(...) row for row.
        disable_shuffling=True,
        features=tfds.features.FeaturesDict({
            "image": tensor((size, size, 3), np.float32),
            "depth": tensor((size, size), np.float32),
            "normal": tensor((size, size, 3), np.float32),
            "object_id": tensor((size, size), np.int32)}))

  def _split_generators(self, dl_manager):
    del dl_manager   # rendered, never downloaded
    c = self.builder_config
    return {"train": self._generate_examples(split_seed(c.seed, "train"), c.num_train),
            "test": self._generate_examples(split_seed(c.seed, "test"), c.num_test)}

  def _generate_examples(self, seed: int, count: int):
    c = self.builder_config
    for i in range(count):
      yield i, render_scene(scene_rng(seed, i), size=c.size, distribution=c.distribution,
                            fov_degrees=FOV_DEGREES)


def load(config: ScenesConfig | None = None, data_dir: str | None = None
         ) -> tfds.core.DatasetBuilder:
  """Builds (once, cached under data_dir) and returns the prepared builder for a config."""
  return pipeline.build(Scenes, config or scenes_config(), data_dir)


def load_arrays(split: str, config: ScenesConfig | None = None, data_dir: str | None = None
                ) -> dict[str, np.ndarray]:
  """A split as stacked arrays, in generation order: row i is scene
  `render_scene(scene_rng(split_seed(config.seed, split), i), ...)`."""
  source = pipeline.data_source(load(config, data_dir), split)
  return {name: np.asarray(values) for name, values in source.columns.items()}
