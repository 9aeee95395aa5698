"""The architecture settings every FreeCG-family model and baseline reads (one frozen record)."""
from __future__ import annotations

import dataclasses

# The elements the data can hold (EMT's fcc metals); an unknown one fails before compiling.
MAX_Z = 100


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """Width, depth and switches of a model. FreeCG's official defaults where they apply.

  cg: `grouped` (FreeCG), `dense` (one group: G = 1, E = C), `none` (ViSNet: the node update
  adds vec3 * o1 to the aggregated vectors instead of a CG product).
  """
  channels: int = 256
  layers: int = 9
  num_rbf: int = 32
  cutoff: float = 5.0
  max_neighbours: int = 32
  num_heads: int = 8
  groups: int = 32
  cg: str = "grouped"
  shuffle: bool = True
  attention_enhancer: bool = True
  smooth_cutoff: bool = False
  vecnorm_type: str = "none"
  tp_implementation: str = "contraction"
  max_z: int = MAX_Z

  @property
  def edges(self) -> int:
    """Channels per group (E); G E = C."""
    return self.channels // self.groups_used

  @property
  def groups_used(self) -> int:
    return 1 if self.cg == "dense" else self.groups
