"""The LNS loop and the public `solve`.

Every LNS run starts from SCIP (its first solution, or its incumbent after the root node). Each step the destroy rule picks the
virtual variables to release (the budget is `destroy_rate` of all of them), branch and search
may release `branch_share` x (released variables) more fixed ones, binarized tightening turns
that into the sub-MIP's bounds, and the persistent SCIP model solves it from the incumbent under
`min(sub_time_limit, time left)`; a better solution is accepted. The clock includes everything:
building the model, the first solution, the LP relaxation, features, the policy and SCIP.

Methods (`METHODS`): `scip` and `highs` alone; `random_lns` (whole variables uniformly at
random, the same budget); `btbs` (learned destroy on bits + branching); `btbs_no_bt` (a destroy
policy trained and acting on whole variables, with a branch head trained the same way on it);
`btbs_no_branch` (btbs's destroy policy alone). The branching head reads its destroy
network's embeddings, computed once per incumbent, and runs on the host (`host_branch`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import time

import jax
import numpy as np

from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import host_branch
from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import neighbourhood
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import solvers
from jaxlab.methods.btbs_lns import tightening

METHODS = ("scip", "highs", "random_lns", "btbs", "btbs_no_bt", "btbs_no_branch")
LEARNED = ("btbs", "btbs_no_bt", "btbs_no_branch")
# (destroy parameters, whole variables only, branch parameters) of each learned method; the
# branch parameters are the destroy network's with a trained branch head.
ARMS = {"btbs": ("destroy_bt", False, "branch"),
        "btbs_no_bt": ("destroy_whole", True, "branch_whole"),
        "btbs_no_branch": ("destroy_bt", False, None)}
MIN_STEP_S = 0.02    # below this much time left no sub-MIP is started


@dataclasses.dataclass(frozen=True)
class LnsSpec:
  destroy_rate: float = 0.2
  sub_time_limit: float = 1.0
  branch_share: float = 0.1
  # Where LNS starts: SCIP's first solution, or its incumbent after the root node, given at most
  # `start_share` of the budget (see the README's deviations).
  start: str = "first"
  start_share: float = 0.4
  # Tests: node-limited sub-MIPs and a fixed number of steps instead of a clock.
  sub_node_limit: int | None = None
  max_steps: int | None = None

  def __post_init__(self):
    if not 0 < self.destroy_rate <= 1:
      raise ValueError(f"lns.destroy_rate must be in (0, 1], got {self.destroy_rate}")
    if not self.sub_time_limit > 0:
      raise ValueError(f"lns.sub_time_limit must be > 0 s, got {self.sub_time_limit}")
    if not 0 <= self.branch_share <= 1:
      raise ValueError(f"lns.branch_share must be in [0, 1], got {self.branch_share}")
    if self.start not in solvers.START_RULES:
      raise ValueError(f"lns.start must be one of {solvers.START_RULES}, got {self.start!r}")
    if not 0 < self.start_share < 1:
      raise ValueError(f"lns.start_share must be in (0, 1), got {self.start_share}")


@dataclasses.dataclass
class Trained:
  """A family's networks: one structure, several parameter sets (keys of `ARMS`)."""
  policy: policy_lib.Policy
  params: dict


@dataclasses.dataclass
class Timing:
  setup_s: float = 0.0
  policy_s: float = 0.0
  solver_s: float = 0.0


def check_budget(time_limit: float | None, spec: LnsSpec) -> None:
  if time_limit is None:
    if spec.max_steps is None:
      raise ValueError("give a time_limit or lns max_steps")
    return
  if time_limit <= spec.sub_time_limit:
    raise ValueError(f"time_limit ({time_limit} s) must exceed the sub-MIP limit "
                     f"({spec.sub_time_limit} s): LNS needs room for more than one step")


def run(mip: instances.MIP, method: str, *, time_limit: float | None, spec: LnsSpec,
        trained: Trained | None = None, seed: int = 0, timing: Timing | None = None
        ) -> solvers.Run:
  """One anytime run of `method` on `mip` (trace times from the call)."""
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
  if method == "scip":
    return solvers.solve_scip(mip, time_limit=time_limit, node_limit=spec.sub_node_limit
                              if time_limit is None else None, seed=seed)
  if method == "highs":
    return solvers.solve_highs(mip, time_limit=time_limit, node_limit=spec.sub_node_limit
                               if time_limit is None else None, seed=seed)
  check_budget(time_limit, spec)
  if method in LEARNED and trained is None:
    raise ValueError(f"method {method!r} needs trained policies")
  timing = timing if timing is not None else Timing()
  start = time.perf_counter()
  elapsed = lambda: time.perf_counter() - start
  rng = np.random.default_rng(seed)
  first = solvers.first_solution(
      mip, seed=seed, rule=spec.start,
      time_limit=60.0 if time_limit is None else spec.start_share * time_limit)
  x, best = first.x, first.objective
  trace = [(elapsed(), best)]
  sub = solvers.SubMipSolver(mip, seed=seed)
  static = None
  if method in LEARNED:
    static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip),
                                        trained.policy.spec.max_bits)
    num_bits = static.num_bits
    bucket = features.bucket_of(features.graph_at(static, x))
  else:
    integer = mip.integrality & np.isfinite(mip.col_lower) & np.isfinite(mip.col_upper)
    num_bits = np.where(integer, _bits(mip, integer), 0)
  budget = neighbourhood.budget_of(num_bits, spec.destroy_rate)
  timing.setup_s += elapsed()
  destroy_network = branch_head = incidence = None
  if method in LEARNED:
    destroy_key, whole, branch_key = ARMS[method]
    destroy_network = policy_lib.bind(trained.policy, trained.params[destroy_key])
    if branch_key is not None and spec.branch_share > 0:
      if not policy_lib.same_trunk(trained.params[destroy_key], trained.params[branch_key]):
        raise ValueError(f"{method}: the {branch_key!r} parameters were not trained on the "
                         f"{destroy_key!r} network (their trunks differ)")
      branch_head = host_branch.BranchHead.of(
          policy_lib.network(trained.policy, trained.params[branch_key]))
  # The trunk reads the incumbent's graph only, so its embeddings, the destroy scores and the
  # branch head's first-layer product change only when a step is accepted; most steps are not,
  # and they reuse them.
  destroy_scores = prepared = None
  steps = 0
  while True:
    remaining = math.inf if time_limit is None else time_limit - elapsed()
    if remaining < MIN_STEP_S or (spec.max_steps is not None and steps >= spec.max_steps):
      break
    tic = time.perf_counter()
    if method == "random_lns":
      first_bit = neighbourhood.uniform_release(num_bits, budget, rng)
    else:
      if destroy_scores is None:
        graph, embedding, destroy_scores = scores_at(destroy_network, static, x, bucket)
        if branch_head is not None:
          if incidence is None:      # the instance's edges: the same at every incumbent
            incidence = host_branch.Incidence.of(graph)
          prepared = branch_head.prepare(jax.device_get(embedding))
      first_bit = neighbourhood.release_from_scores(destroy_scores, num_bits, budget, rng,
                                                    whole=whole)
      if branch_head is not None:
        first_bit = branch_and_search(branch_head, prepared, incidence, first_bit, num_bits,
                                      spec.branch_share)
    lower, upper = neighbourhood.bounds(mip, x, first_bit, num_bits)
    timing.policy_s += time.perf_counter() - tic
    remaining = math.inf if time_limit is None else time_limit - elapsed()
    if remaining < MIN_STEP_S:
      break
    tic = time.perf_counter()
    objective, candidate = sub.solve(
        lower, upper, x,
        time_limit=None if spec.sub_node_limit is not None else min(spec.sub_time_limit,
                                                                    remaining),
        node_limit=spec.sub_node_limit)
    timing.solver_s += time.perf_counter() - tic
    steps += 1
    if solvers.improves(objective, best):
      x, best = candidate, objective
      destroy_scores = None
      trace.append((elapsed(), best))
  return solvers.Run(best, x, trace, "lns", steps)


def scores_at(network: policy_lib.Network, static: features.StaticFeatures, x: np.ndarray,
              bucket) -> tuple[features.Graph, jax.Array, np.ndarray]:
  """(the padded graph at incumbent `x`, the trunk's embeddings on it (on the device), the
  destroy scores [n, D])."""
  graph = features.pad(features.graph_at(static, x), bucket)
  embedding, destroy = network(graph)
  return graph, embedding, jax.device_get(destroy)


def sample_release(network: policy_lib.Network, static: features.StaticFeatures,
                   x: np.ndarray, bucket, budget: int, rng: np.random.Generator | None, *,
                   whole: bool = False) -> tuple[np.ndarray, features.Graph]:
  """(first_bit, the padded graph it was sampled on): one destroy step of a network at `x`."""
  graph, _, destroy = scores_at(network, static, x, bucket)
  return neighbourhood.release_from_scores(destroy, static.num_bits, budget, rng,
                                           whole=whole), graph


def branch_and_search(head: host_branch.BranchHead, prepared: np.ndarray,
                      incidence: host_branch.Incidence, first_bit: np.ndarray,
                      num_bits: np.ndarray, share: float) -> np.ndarray:
  """The branch head scores the fixed variables given the destroy step's neighbourhood
  (`prepared`: its first layer's product with the incumbent's embeddings); the top `share` x
  (released variables) of them are released whole as well."""
  released = np.zeros(prepared.shape[0], bool)
  released[:num_bits.shape[0]] = first_bit < num_bits
  branch = head.logits(prepared, incidence, released)
  first_bit, _ = neighbourhood.add_branching(first_bit, num_bits, branch,
                                             int(round(share * int(released.sum()))))
  return first_bit


def _bits(mip: instances.MIP, integer: np.ndarray) -> np.ndarray:
  return tightening.num_bits(np.where(integer, mip.col_lower, 0),
                             np.where(integer, mip.col_upper, 0))


# ---------------------------------------------------------------------------------------------
# Saved policies and the public entry point.

POLICY_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "..", "results",
                          "btbs_lns_policies")


def save_trained(trained: Trained, path: str, keys: tuple[str, ...] | None = None) -> None:
  """The parameter sets `keys` (default all) and the spec in one .npz."""
  arrays = {"spec": np.asarray(repr(dataclasses.asdict(trained.policy.spec)))}
  for name, params in trained.params.items():
    if keys is not None and name not in keys:
      continue
    for path_keys, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
      arrays[name + "/" + jax.tree_util.keystr(path_keys)] = np.asarray(leaf)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  np.savez_compressed(path, **arrays)


def load_trained(path: str) -> Trained:
  if not os.path.exists(path):
    raise FileNotFoundError(f"no trained policy at {path}; run the btbs_lns experiment first")
  with np.load(path) as data:
    spec = policy_lib.PolicySpec(**eval(str(data["spec"]), {"__builtins__": {}}))  # pylint: disable=eval-used
    policy, template = policy_lib.Policy.create(spec)
    names = sorted({key.split("/", 1)[0] for key in data.files if key != "spec"})
    params = {}
    for name in names:
      leaves, treedef = jax.tree_util.tree_flatten_with_path(template)
      params[name] = jax.tree_util.tree_unflatten(
          treedef, [data[name + "/" + jax.tree_util.keystr(k)] for k, _ in leaves])
  return Trained(policy, params)


def from_mps(path: str) -> instances.MIP:
  """A `MIP` read by HiGHS from an MPS (or LP) file."""
  import highspy  # pylint: disable=g-import-not-at-top
  import scipy.sparse  # pylint: disable=g-import-not-at-top
  if not os.path.isfile(path):
    raise ValueError(f"MPS file {path!r} does not exist")
  reader = solvers.to_highs(instances.MIP(
      "empty", np.zeros(0), np.zeros(1, np.int64), np.zeros(0, np.int64), np.zeros(0),
      np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0), np.zeros(0, bool)))
  status = reader.readModel(path)
  if status != highspy.HighsStatus.kOk:
    raise ValueError(f"could not read MPS file {path!r} (HiGHS: {status})")
  lp = reader.getLp()
  n, m = lp.num_col_, lp.num_row_
  a = lp.a_matrix_
  columnwise = scipy.sparse.csc_matrix(
      (np.asarray(a.value_, float), np.asarray(a.index_), np.asarray(a.start_)),
      shape=(m, n)).tocsr()
  integrality = (np.asarray([int(k) for k in lp.integrality_]) > 0 if len(lp.integrality_)
                 else np.zeros(n, bool))
  unbounded = lambda v: np.where(np.abs(v) >= highspy.kHighsInf, np.copysign(np.inf, v), v)
  sign = -1.0 if lp.sense_ == highspy.ObjSense.kMaximize else 1.0
  return instances.MIP(
      name=os.path.splitext(os.path.basename(path))[0], c=sign * np.asarray(lp.col_cost_),
      indptr=columnwise.indptr.astype(np.int64), indices=columnwise.indices.astype(np.int64),
      data=columnwise.data.astype(float), row_lower=unbounded(np.asarray(lp.row_lower_)),
      row_upper=unbounded(np.asarray(lp.row_upper_)),
      col_lower=unbounded(np.asarray(lp.col_lower_)),
      col_upper=unbounded(np.asarray(lp.col_upper_)), integrality=integrality)


def solve(mps_path: str, method: str = "btbs", time_limit: float = 10.0,
          policy: str | None = None, seed: int = 0, spec: LnsSpec | None = None,
          policy_dir: str | None = None) -> tuple[float | None, np.ndarray | None, list]:
  """(objective, x, trace) of `method` on the MIP in `mps_path` within `time_limit` seconds.

  Learned methods read `<policy_dir>/<policy>.npz` (default: the experiment's committed
  `results/btbs_lns_policies/`), `policy` naming the family it was trained on. Bad inputs fail
  before any solving."""
  spec = spec or LnsSpec()
  if method not in METHODS:
    raise ValueError(f"unknown method {method!r}; choose one of {', '.join(METHODS)}")
  if method not in ("scip", "highs"):
    check_budget(time_limit, spec)
  trained = None
  if method in LEARNED:
    if policy not in instances.FAMILIES:
      raise ValueError(f"unknown policy family {policy!r}; choose one of "
                       f"{', '.join(instances.FAMILIES)}")
    trained = load_trained(os.path.join(policy_dir or POLICY_DIR, f"{policy}.npz"))
    missing = {ARMS[method][0], ARMS[method][2]} - {None} - set(trained.params)
    if missing:
      raise ValueError(f"the {policy} policy file has no {sorted(missing)} parameters for "
                       f"method {method!r}")
  mip = from_mps(mps_path)
  result = run(mip, method, time_limit=time_limit, spec=spec, trained=trained, seed=seed)
  return result.objective, result.x, result.trace
