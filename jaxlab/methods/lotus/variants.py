"""The fine-tuning variants of the paper's analysis (its section 3), one frozen description each.

A: eps-prediction, multi-step (Marigold-like); B: x0-prediction, multi-step; C (Lotus-G):
x0-prediction in a single step from pure noise at t = T; D (Lotus-D): C without the noise input;
E: C with the detail preserver (a task switcher: the same network, told by an embedding,
reconstructs the input image in the same batch).
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Variant:
  parameterization: str          # "eps" or "x0"
  single_step: bool              # trained and run at t = T only
  noise_input: bool = True       # False: the target channels of the input are zeros (Lotus-D)
  detail_preserver: bool = False


VARIANTS = {
    "eps_multi": Variant("eps", single_step=False),
    "x0_multi": Variant("x0", single_step=False),
    "lotus_g": Variant("x0", single_step=True),
    "lotus_d": Variant("x0", single_step=True, noise_input=False),
    "lotus_g_detail": Variant("x0", single_step=True, detail_preserver=True),
}
# The task switcher's two settings.
ANNOTATION, RECONSTRUCTION = 0, 1
