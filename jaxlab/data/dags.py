"""Weighted directed acyclic graphs: random synthetic DAGs and the DREAM5 gene networks.

A `WeightedDag` has N nodes with 2-d features (a layered drawing of the graph, normalised to
[0, 1]^2) and E weighted edges source -> target.

Synthetic graphs (as in the Neural SpaceTimes experiments): a directed G(n, p) random graph whose
edges u -> v with u < v are kept (each such pair independently with probability p); node features
are the drawing's coordinates; edge weights are one of five functions of the Euclidean distance
between the endpoints' coordinates (`METRIC_TYPES`).

DREAM5 (network1 in silico, network3 E. coli, network4 S. cerevisiae; gold-standard edges shipped
in `jaxlab/data/dream5/`) contains directed cycles. We make it a DAG by condensing every strongly
connected component into one node (duplicate edges merged, self-loops dropped); edge weights are
max(cosine similarity of the endpoints' coordinates, 0.01), as in the official code.

Drawings: Graphviz `dot` when the binary is on PATH (Debian package `graphviz`), otherwise a
deterministic layered layout by topological generations (`generation_layout`). `WeightedDag.layout`
records which one was used. Layouts of large graphs are cached under the data directory.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import shutil
import subprocess
from typing import Sequence

import numpy as np
from scipy.sparse import csgraph
import scipy.sparse

from jaxlab.data import pipeline

METRIC_TYPES = ("type1", "type2", "type3", "type4", "type5")
LAYOUTS = ("auto", "dot", "generations")
DREAM5_NETWORKS = {"in_silico": "network1.tsv", "e_coli": "network3.tsv",
                   "s_cerevisiae": "network4.tsv"}
DREAM5_DIR = pathlib.Path(__file__).with_name("dream5")


@dataclasses.dataclass(frozen=True)
class WeightedDag:
  name: str
  features: np.ndarray     # [N, 2] float32 in [0, 1]
  sources: np.ndarray      # [E] int32
  targets: np.ndarray      # [E] int32
  weights: np.ndarray      # [E] float32
  layout: str              # "dot" or "generations"

  @property
  def num_nodes(self) -> int:
    return int(self.features.shape[0])

  @property
  def num_edges(self) -> int:
    return int(self.sources.shape[0])


# ---------------------------------------------------------------------------------------------
# Graph structure.


def random_dag_edges(num_nodes: int, p: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
  """Edges u -> v, u < v, each present independently with probability p (sorted by (u, v))."""
  if num_nodes < 2 or not 0.0 < p <= 1.0:
    raise ValueError(f"need num_nodes >= 2 and 0 < p <= 1, got {num_nodes}, {p}")
  rng = np.random.default_rng(seed)
  upper = np.triu(rng.random((num_nodes, num_nodes)) < p, k=1)
  sources, targets = np.nonzero(upper)
  return sources.astype(np.int32), targets.astype(np.int32)


def topological_generations(num_nodes: int, sources: np.ndarray,
                            targets: np.ndarray) -> np.ndarray:
  """The generation of every node: 0 for sources, else 1 + the largest parent generation.

  Raises ValueError when the graph has a directed cycle.
  """
  in_degree = np.bincount(targets, minlength=num_nodes)
  children: list[list[int]] = [[] for _ in range(num_nodes)]
  for u, v in zip(sources.tolist(), targets.tolist()):
    children[u].append(v)
  generation = np.zeros(num_nodes, np.int64)
  frontier = [int(v) for v in np.flatnonzero(in_degree == 0)]
  seen = 0
  while frontier:
    seen += len(frontier)
    next_frontier = []
    for u in frontier:
      for v in children[u]:
        generation[v] = max(generation[v], generation[u] + 1)
        in_degree[v] -= 1
        if in_degree[v] == 0:
          next_frontier.append(v)
    frontier = next_frontier
  if seen != num_nodes:
    raise ValueError(f"the graph has a directed cycle ({num_nodes - seen} nodes on or after one)")
  return generation


def condense_cycles(num_nodes: int, sources: np.ndarray, targets: np.ndarray
                    ) -> tuple[int, np.ndarray, np.ndarray, np.ndarray]:
  """Strongly connected components -> single nodes. Returns (num_components, sources, targets,
  component of each original node); edges inside a component vanish, parallel ones merge."""
  adjacency = scipy.sparse.coo_matrix(
      (np.ones(len(sources)), (sources, targets)), shape=(num_nodes, num_nodes)).tocsr()
  num_components, component = csgraph.connected_components(adjacency, directed=True,
                                                            connection="strong")
  pairs = np.stack([component[sources], component[targets]], axis=1)
  pairs = np.unique(pairs[pairs[:, 0] != pairs[:, 1]], axis=0)
  return (int(num_components), pairs[:, 0].astype(np.int32), pairs[:, 1].astype(np.int32),
          component.astype(np.int32))


# ---------------------------------------------------------------------------------------------
# Drawings.


def normalise_coordinates(coords: np.ndarray) -> np.ndarray:
  """Each axis scaled to [0, 1] (a constant axis becomes 0.5)."""
  coords = np.asarray(coords, np.float64)
  low, high = coords.min(axis=0), coords.max(axis=0)
  span = np.where(high > low, high - low, 1.0)
  return np.where(high > low, (coords - low) / span, 0.5)


def generation_layout(num_nodes: int, sources: np.ndarray, targets: np.ndarray,
                      sweeps: int = 4) -> np.ndarray:
  """A layered drawing [N, 2]: y = -generation (sources on top, as `dot` draws), x = the rank
  inside the generation after a few barycenter sweeps (each node placed at the mean position of
  its parents, then of its children) to reduce crossings. Deterministic."""
  generation = topological_generations(num_nodes, sources, targets)
  order = np.zeros(num_nodes)
  layers = [np.flatnonzero(generation == g) for g in range(int(generation.max()) + 1)]
  for layer in layers:
    order[layer] = np.arange(len(layer)) - (len(layer) - 1) / 2
  parents: list[list[int]] = [[] for _ in range(num_nodes)]
  children: list[list[int]] = [[] for _ in range(num_nodes)]
  for u, v in zip(sources.tolist(), targets.tolist()):
    parents[v].append(u)
    children[u].append(v)

  def place(layer: np.ndarray, neighbours: list[list[int]]) -> None:
    centre = np.array([np.mean(order[neighbours[v]]) if neighbours[v] else order[v]
                       for v in layer])
    ranked = layer[np.lexsort((layer, centre))]
    order[ranked] = np.arange(len(layer)) - (len(layer) - 1) / 2

  for _ in range(sweeps):
    for layer in layers[1:]:
      place(layer, parents)
    for layer in reversed(layers[:-1]):
      place(layer, children)
  return np.stack([order, -generation.astype(np.float64)], axis=1)


def dot_available() -> bool:
  return shutil.which("dot") is not None


def dot_layout(num_nodes: int, sources: np.ndarray, targets: np.ndarray,
               timeout_s: float = 900.0) -> np.ndarray:
  """Node positions [N, 2] from Graphviz `dot -Tplain` (nodes named by index)."""
  if not dot_available():
    raise RuntimeError("Graphviz `dot` is not on PATH (Debian: apt-get install graphviz)")
  lines = ["digraph G {"] + [f"{v};" for v in range(num_nodes)]
  lines += [f"{u} -> {v};" for u, v in zip(sources.tolist(), targets.tolist())] + ["}"]
  done = subprocess.run(["dot", "-Tplain"], input="\n".join(lines), capture_output=True,
                        text=True, timeout=timeout_s, check=False)
  if done.returncode != 0:
    raise RuntimeError(f"dot failed ({done.returncode}): {done.stderr[-2000:]}")
  coords = np.full((num_nodes, 2), np.nan)
  for line in done.stdout.splitlines():
    fields = line.split()
    if fields and fields[0] == "node":
      coords[int(fields[1])] = float(fields[2]), float(fields[3])
  if np.isnan(coords).any():
    raise RuntimeError("dot's output is missing some nodes")
  return coords


def resolve_layout(layout: str) -> str:
  if layout not in LAYOUTS:
    raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
  if layout == "auto":
    return "dot" if dot_available() else "generations"
  return layout


def draw(num_nodes: int, sources: np.ndarray, targets: np.ndarray, layout: str = "auto",
         cache_dir: str | os.PathLike | None = None) -> tuple[np.ndarray, str]:
  """Normalised coordinates [N, 2] float32 and the layout actually used.

  With `cache_dir`, the drawing is stored under a hash of the graph and the layout (dot takes
  ~15 s on a DREAM5 network).
  """
  layout = resolve_layout(layout)
  cache = None
  if cache_dir is not None:
    digest = hashlib.sha256(np.stack([sources, targets]).astype(np.int64).tobytes()
                            + f"{num_nodes}/{layout}".encode()).hexdigest()[:16]
    cache = pathlib.Path(cache_dir) / f"{layout}-{digest}.npy"
    if cache.exists():
      return np.load(cache), layout
  raw = (dot_layout if layout == "dot" else generation_layout)(num_nodes, sources, targets)
  coords = normalise_coordinates(raw).astype(np.float32)
  if cache is not None:
    cache.parent.mkdir(parents=True, exist_ok=True)
    temporary = cache.with_suffix(f".{os.getpid()}.tmp.npy")
    np.save(temporary, coords)
    os.replace(temporary, cache)
  return coords, layout


# ---------------------------------------------------------------------------------------------
# Edge weights and datasets.


def metric_weight(distance: np.ndarray, metric_type: str) -> np.ndarray:
  """The five edge-weight functions of the Euclidean distance e between drawn endpoints."""
  e = np.asarray(distance, np.float64)
  with np.errstate(divide="ignore", invalid="ignore"):
    if metric_type == "type1":
      return np.sqrt(e) * np.sqrt(np.log1p(e))
    if metric_type == "type2":
      return e**0.1 * np.log1p(e)**0.9
    if metric_type == "type3":
      return 1.0 - 1.0 / (1.0 + np.sqrt(e))
    if metric_type == "type4":
      return 1.0 - np.exp((1.0 - e) / np.log(e))
    if metric_type == "type5":
      return 1.0 - 1.0 / (1.0 + e**0.2 + e**0.5)
  raise ValueError(f"unknown metric type {metric_type!r}; choose one of {METRIC_TYPES}")


def _layout_cache_dir(data_dir: str | None) -> str:
  return os.path.join(data_dir or pipeline.default_data_dir(), "dag_layouts")


def synthetic_dag(metric_type: str, *, num_nodes: int = 50, p: float = 0.9, seed: int = 123,
                  layout: str = "auto", data_dir: str | None = None) -> WeightedDag:
  """A random DAG with edge weights of `metric_type` (see the module docstring)."""
  if metric_type not in METRIC_TYPES:
    raise ValueError(f"unknown metric type {metric_type!r}; choose one of {METRIC_TYPES}")
  sources, targets = random_dag_edges(num_nodes, p, seed)
  features, used = draw(num_nodes, sources, targets, layout, _layout_cache_dir(data_dir))
  distance = np.linalg.norm(features[sources].astype(np.float64)
                            - features[targets].astype(np.float64), axis=-1)
  weights = metric_weight(distance, metric_type)
  keep = np.isfinite(weights) & (weights > 0)   # type4 at e = 1 or coincident endpoints
  return WeightedDag(name=f"synthetic_{metric_type}", features=features,
                     sources=sources[keep], targets=targets[keep],
                     weights=weights[keep].astype(np.float32), layout=used)


def read_dream5_edges(network: str) -> tuple[list[str], np.ndarray, np.ndarray]:
  """(gene names, sources, targets) of a DREAM5 gold-standard network, self-loops dropped."""
  if network not in DREAM5_NETWORKS:
    raise ValueError(f"unknown DREAM5 network {network!r}; choose one of "
                     f"{sorted(DREAM5_NETWORKS)}")
  path = DREAM5_DIR / DREAM5_NETWORKS[network]
  if not path.exists():
    raise FileNotFoundError(f"{path} is missing; it ships with the package (reinstall jaxlab)")
  names: dict[str, int] = {}
  edges = []
  for line in path.read_text().splitlines():
    fields = line.split("\t")
    if len(fields) < 3 or float(fields[2]) <= 0 or fields[0] == fields[1]:
      continue
    edges.append((names.setdefault(fields[0], len(names)),
                  names.setdefault(fields[1], len(names))))
  pairs = np.unique(np.asarray(edges, np.int32), axis=0)
  return list(names), pairs[:, 0], pairs[:, 1]


def dream5_dag(network: str, *, layout: str = "auto", data_dir: str | None = None
               ) -> WeightedDag:
  """A DREAM5 network, cycles condensed, drawn, weighted by clipped cosine similarity."""
  names, sources, targets = read_dream5_edges(network)
  num_nodes, sources, targets, _ = condense_cycles(len(names), sources, targets)
  features, used = draw(num_nodes, sources, targets, layout, _layout_cache_dir(data_dir))
  a, b = features[sources].astype(np.float64), features[targets].astype(np.float64)
  norms = np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1)
  cosine = np.sum(a * b, axis=-1) / np.maximum(norms, 1e-12)
  weights = np.maximum(cosine, 0.01)
  return WeightedDag(name=f"dream5_{network}", features=features, sources=sources,
                     targets=targets, weights=weights.astype(np.float32), layout=used)


def load(dataset: str, *, num_nodes: int = 50, p: float = 0.9, seed: int = 123,
         layout: str = "auto", data_dir: str | None = None) -> WeightedDag:
  """`synthetic_type1` ... `synthetic_type5` or `dream5_<network>` by name."""
  if dataset.startswith("synthetic_"):
    return synthetic_dag(dataset.removeprefix("synthetic_"), num_nodes=num_nodes, p=p,
                         seed=seed, layout=layout, data_dir=data_dir)
  if dataset.startswith("dream5_"):
    return dream5_dag(dataset.removeprefix("dream5_"), layout=layout, data_dir=data_dir)
  raise ValueError(f"unknown dataset {dataset!r}; choose one of {list(dataset_names())}")


def dataset_names() -> Sequence[str]:
  return ([f"synthetic_{t}" for t in METRIC_TYPES]
          + [f"dream5_{n}" for n in DREAM5_NETWORKS])
