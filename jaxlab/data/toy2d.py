"""Two-dimensional toy distributions for diffusion experiments, generated in NumPy (seeded).

`gaussian_ring`: an equal mixture of `modes` isotropic Gaussians (std `std`) centred on a circle
of radius `radius`, the usual "8 Gaussians" with its defaults. Points float32 [N, 2].
"""
from __future__ import annotations

import numpy as np


def ring_centres(modes: int = 8, radius: float = 2.0) -> np.ndarray:
  angles = 2.0 * np.pi * np.arange(modes) / modes
  return radius * np.stack([np.cos(angles), np.sin(angles)], -1)


def gaussian_ring(num: int, *, seed: int = 0, modes: int = 8, radius: float = 2.0,
                  std: float = 0.2) -> np.ndarray:
  if num < 1 or modes < 1 or radius <= 0 or std <= 0:
    raise ValueError(f"need num, modes >= 1 and radius, std > 0; got {num}, {modes}, {radius}, "
                     f"{std}")
  rng = np.random.default_rng(seed)
  centres = ring_centres(modes, radius)[rng.integers(0, modes, num)]
  return (centres + std * rng.normal(size=(num, 2))).astype(np.float32)
