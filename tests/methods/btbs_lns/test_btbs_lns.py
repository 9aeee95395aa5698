"""btbs_lns: solver interfaces, sub-MIPs against brute force, the local-branching linearisation,
neighbourhoods, the policy's symmetries and compilation, training targets and `solve`.
Every solver call here is limited by nodes, never by time."""
import itertools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import host_branch
from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import lns
from jaxlab.methods.btbs_lns import neighbourhood
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import reinforce
from jaxlab.methods.btbs_lns import solvers
from jaxlab.methods.btbs_lns import training

NODES = 1000


def small_integer_mip(seed=0, n=10, m=4, upper=5) -> instances.MIP:
  """min c.x, A x >= b with integer 0 <= x <= upper: small enough to enumerate."""
  rng = np.random.default_rng(seed)
  dense = rng.integers(1, 5, (m, n)).astype(float) * (rng.random((m, n)) < 0.6)
  dense[:, 0] = np.maximum(dense[:, 0], 1)          # every row coverable
  b = np.floor(0.3 * dense.sum(1) * upper)
  rows = [np.flatnonzero(r) for r in dense]
  indptr = np.concatenate([[0], np.cumsum([len(r) for r in rows])])
  return instances.MIP("small", rng.integers(1, 20, n).astype(float), indptr,
                       np.concatenate(rows), np.concatenate([d[r] for d, r in zip(dense, rows)]),
                       b, np.full(m, np.inf), np.zeros(n), np.full(n, float(upper)),
                       np.ones(n, bool))


def brute_force(mip: instances.MIP, lower, upper, extra=lambda x: True) -> float:
  best = np.inf
  ranges = [range(int(lo), int(hi) + 1) for lo, hi in zip(lower, upper)]
  for point in itertools.product(*ranges):
    x = np.asarray(point, float)
    if mip.is_feasible(x) and extra(x):
      best = min(best, mip.objective(x))
  return best


def test_sub_mip_with_every_bit_free_equals_brute_force():
  mip = small_integer_mip(n=6, upper=3)
  start = mip.col_upper.copy()
  sub = solvers.SubMipSolver(mip)
  bits = features.tightening.num_bits(mip.col_lower, mip.col_upper)
  lower, upper = neighbourhood.bounds(mip, start, np.zeros_like(bits), bits)
  np.testing.assert_array_equal(lower, mip.col_lower)
  np.testing.assert_array_equal(upper, mip.col_upper)
  objective, x = sub.solve(lower, upper, start, node_limit=NODES)
  assert objective == pytest.approx(brute_force(mip, lower, upper))
  assert mip.is_feasible(x)
  # Then a tightened neighbourhood: the sub-MIP optimum is the box's brute-force optimum, and
  # the persistent model restores the bounds for the next call.
  first_bit = np.where(np.arange(6) % 2 == 0, 1, bits)
  lower, upper = neighbourhood.bounds(mip, start, first_bit, bits)
  objective, x = sub.solve(lower, upper, start, node_limit=NODES)
  assert objective == pytest.approx(brute_force(mip, lower, upper))
  assert np.all(x >= lower - 1e-9) and np.all(x <= upper + 1e-9)


def test_local_branching_matches_enumeration():
  mip = small_integer_mip(seed=1, n=5, upper=3)
  incumbent = mip.col_upper.copy()
  for kappa in (1, 3, 6):
    objective, x = solvers.local_branching(mip, incumbent, kappa, node_limit=NODES)
    within = lambda y: np.abs(y - incumbent).sum() <= kappa + 1e-9
    assert objective == pytest.approx(brute_force(mip, mip.col_lower, mip.col_upper, within))
    assert within(x) and mip.is_feasible(x)


def test_scip_and_highs_traces_end_at_their_objective():
  mip = instances.generate("setcover", 3, num_rows=30, num_cols=60, density=0.1)
  for run in (solvers.solve_scip(mip, node_limit=NODES), solvers.solve_highs(mip,
                                                                              node_limit=NODES)):
    assert run.trace, "no incumbent was traced"
    objectives = [z for _, z in run.trace]
    assert objectives == sorted(objectives, reverse=True)
    assert objectives[-1] == pytest.approx(run.objective)
    assert mip.is_feasible(run.x)
    assert mip.objective(run.x) == pytest.approx(run.objective)


def test_release_respects_budget_and_modes():
  rng = np.random.default_rng(0)
  bits = np.asarray([1, 1, 3, 3, 0, 7])
  scores = rng.normal(size=(6, 8))
  for whole in (False, True):
    first = neighbourhood.release_from_scores(scores, bits, 4, None, whole=whole)
    freed = np.sum(bits - first)
    assert freed >= 4 and np.all(first <= bits) and first[4] == 0 == bits[4]
    if whole:
      assert set(np.unique(first[first < bits])) <= {0}
  uniform = neighbourhood.uniform_release(bits, 5, rng)
  assert np.sum(bits - uniform) >= 5 and set(uniform[uniform < bits]) <= {0}
  fixed_first = np.asarray([1, 0, 3, 3, 0, 7])
  branched, extra = neighbourhood.add_branching(fixed_first, bits,
                                                np.asarray([9, 0, 1, 5, 9, 2.0]), 2)
  assert extra.tolist() == [True, False, False, True, False, False]
  assert branched.tolist() == [0, 0, 3, 0, 0, 7]


def test_first_changed_bit_neighbourhood_reaches_the_new_value():
  rng = np.random.default_rng(1)
  lower, upper = np.zeros(50), rng.integers(1, 100, 50).astype(float)
  old = np.floor(rng.random(50) * (upper + 1))
  new = np.floor(rng.random(50) * (upper + 1))
  mip = instances.MIP("box", np.zeros(50), np.zeros(1, np.int64), np.zeros(0, np.int64),
                      np.zeros(0), np.zeros(0), np.zeros(0), lower, upper, np.ones(50, bool))
  static_bits = features.tightening.num_bits(lower, upper)
  encode = lambda x: features.tightening.encode(x, lower, upper)
  first = neighbourhood.first_changed_bit(encode(old), encode(new), static_bits)
  low, high = neighbourhood.bounds(mip, old, first, static_bits)
  assert np.all((low <= new) & (new <= high))
  assert np.all((first == static_bits) == (old == new))


def graph_of(mip, seed=0):
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), 8)
  x = instances.known_feasible_point(mip, "intcover")
  return features.graph_at(static, x)


def test_policy_is_permutation_equivariant_and_padding_inert():
  mip = instances.generate("intcover", 0, num_rows=12, num_cols=20, density=0.3)
  graph = graph_of(mip)
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))
  released = np.arange(20) % 3 == 0
  destroy, branch = policy_lib.jitted_logits(policy, params, graph, released)
  # Permuted variables and constraints.
  rng = np.random.default_rng(0)
  pv, pc = rng.permutation(20), rng.permutation(12)
  inverse_v, inverse_c = np.argsort(pv), np.argsort(pc)
  permuted = graph._replace(
      variables=graph.variables[pv], bits=graph.bits[pv], bit_mask=graph.bit_mask[pv],
      var_obj=graph.var_obj[pv], var_mask=graph.var_mask[pv],
      constraints=graph.constraints[pc], con_obj=graph.con_obj[pc], con_mask=graph.con_mask[pc],
      edge_var=inverse_v[graph.edge_var].astype(np.int32),
      edge_con=inverse_c[graph.edge_con].astype(np.int32))
  destroy_p, branch_p = policy_lib.jitted_logits(policy, params, permuted, released[pv])
  np.testing.assert_allclose(np.asarray(destroy_p), np.asarray(destroy)[pv], atol=1e-5)
  np.testing.assert_allclose(np.asarray(branch_p), np.asarray(branch)[pv], atol=1e-5)
  # Padding to a larger bucket changes no real node's output.
  padded = features.pad(graph, (64, 32, 512))
  destroy_pad, branch_pad = policy_lib.jitted_logits(policy, params, padded,
                                                     np.pad(released, (0, 44)))
  np.testing.assert_allclose(np.asarray(destroy_pad)[:20], np.asarray(destroy), atol=1e-5)
  np.testing.assert_allclose(np.asarray(branch_pad)[:20], np.asarray(branch), atol=1e-5)
  # The neighbourhood reaches the branch head only.
  destroy_none, branch_none = policy_lib.jitted_logits(policy, params, graph)
  np.testing.assert_array_equal(np.asarray(destroy_none), np.asarray(destroy))
  assert not np.allclose(np.asarray(branch_none), np.asarray(branch))


def test_released_context_counts_each_rows_released_share():
  mip = instances.generate("intcover", 0, num_rows=12, num_cols=20, density=0.3)
  graph = features.pad(graph_of(mip), (32, 16, 256))
  released = np.zeros(32, bool)
  released[:20] = np.arange(20) % 3 == 0
  released[25] = True        # a padding variable: masked out
  context = np.asarray(policy_lib.released_context(graph, released))
  dense = np.zeros((12, 20))
  dense[np.repeat(np.arange(12), np.diff(mip.indptr)), mip.indices] = 1.0
  row_share = dense @ released[:20] / dense.sum(1)
  shares = np.where(dense > 0, row_share[:, None], np.nan)
  np.testing.assert_allclose(context[:20, 0], released[:20])
  np.testing.assert_allclose(context[:20, 1], np.nanmean(shares, axis=0), rtol=1e-6)
  np.testing.assert_allclose(context[:20, 2], np.nanmax(shares, axis=0), rtol=1e-6)
  np.testing.assert_array_equal(context[20:, 0], 0.0)


def test_branch_head_training_keeps_the_destroy_network():
  mip = small_integer_mip(3)
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), 8)
  target = static.num_bits.copy()
  target[::4] = 0
  samples = [training.Sample(static, np.rint(mip.col_upper), target)]
  bucket = training.bucket_of_samples(samples)
  policy, destroy = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))
  first_bit = np.where(np.arange(static.num_bits.shape[0]) % 2 == 0, 0, static.num_bits)
  dataset = training.branch_dataset(samples, bucket, [first_bit])
  branch, losses = training.fit(policy, destroy, dataset, "branch",
                                training.FitSpec(steps=11, batch_size=1), progress=False)
  assert losses[-1] < losses[0]
  assert policy_lib.same_trunk(destroy, branch)
  changed = [path for (path, a), (_, b) in zip(jax.tree_util.tree_flatten_with_path(destroy)[0],
                                               jax.tree_util.tree_flatten_with_path(branch)[0])
             if not np.array_equal(a, b)]
  assert changed and all("branch_head" in jax.tree_util.keystr(p) for p in changed)
  assert not policy_lib.same_trunk(destroy, policy.init(1))
  trained = lns.Trained(policy, {"destroy_bt": destroy, "branch": policy.init(1)})
  with pytest.raises(ValueError, match="trunks differ"):
    lns.run(mip, "btbs", time_limit=None, trained=trained,
            spec=lns.LnsSpec(sub_node_limit=NODES, max_steps=1))


def test_lns_loop_runs_the_trunk_only_when_the_incumbent_changes(monkeypatch):
  mip = small_integer_mip(3)
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))
  trained = lns.Trained(policy, {"destroy_bt": params, "branch": params})
  calls = {"trunk": 0, "branch": 0, "prepare": 0}
  bind, logits, prepare = (policy_lib.bind, host_branch.BranchHead.logits,
                           host_branch.BranchHead.prepare)

  def counting_bind(policy_, params_):
    network = bind(policy_, params_)

    def counted(graph):
      calls["trunk"] += 1
      return network(graph)
    return counted

  def counting(name, fn):
    def counted(*args):
      calls[name] += 1
      return fn(*args)
    return counted

  monkeypatch.setattr(policy_lib, "bind", counting_bind)
  monkeypatch.setattr(host_branch.BranchHead, "logits", counting("branch", logits))
  monkeypatch.setattr(host_branch.BranchHead, "prepare", counting("prepare", prepare))
  run = lns.run(mip, "btbs", time_limit=None, trained=trained,
                spec=lns.LnsSpec(sub_node_limit=NODES, max_steps=6, destroy_rate=0.5))
  accepted = len(run.trace) - 1
  assert run.steps == 6 and calls["branch"] == 6
  assert accepted < 5        # this instance rejects some steps, which reuse the scores
  # Once at the start, then after each accepted step but a last one (nothing samples after it).
  assert calls["trunk"] in (accepted, accepted + 1) and calls["prepare"] == calls["trunk"]


def test_host_branch_head_equals_the_networks():
  mip = instances.generate("intcover", 0, num_rows=12, num_cols=20, density=0.3)
  graph = features.pad(graph_of(mip), (32, 16, 256))
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))
  head = host_branch.BranchHead.of(policy_lib.network(policy, params))
  incidence = host_branch.Incidence.of(graph)
  prepared = head.prepare(np.asarray(policy_lib.bind(policy, params)(graph)[0]))
  context = jax.jit(policy_lib.released_context)
  for seed in range(3):
    released = np.zeros(32, bool)
    released[:20] = np.random.default_rng(seed).random(20) < 0.4
    np.testing.assert_allclose(incidence.context(released), context(graph, released),
                               atol=1e-6)
    np.testing.assert_allclose(head.logits(prepared, incidence, released)[:20],
                               policy_lib.jitted_logits(policy, params, graph, released)[1][:20],
                               atol=1e-5)


def test_policy_compiles_once_per_bucket():
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))

  @jax.jit
  @chex.assert_max_traces(n=1)
  def apply(params, graph):
    return policy_lib.jitted_logits(policy, params, graph)

  for seed in (1, 2, 3):
    mip = instances.generate("intcover", seed, num_rows=12, num_cols=20, density=0.3)
    jax.block_until_ready(apply(params, features.pad(graph_of(mip), (32, 16, 256))))


def test_targets_and_weighted_loss():
  mip = instances.generate("intcover", 0, num_rows=12, num_cols=20, density=0.3)
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), 8)
  x = instances.known_feasible_point(mip, "intcover")
  target = static.num_bits.copy()
  target[3] = 2
  sample = training.Sample(static, x, target)
  labels, mask = training.destroy_targets(sample, whole=False)
  assert labels.sum() == 1 and labels[3, 2] == 1 and mask[3, :static.num_bits[3]].all()
  labels, mask = training.destroy_targets(sample, whole=True)
  assert labels.sum() == 1 and labels[3, 0] == 1 and mask[:, 1:].sum() == 0
  first_bit = static.num_bits.copy()
  first_bit[:2] = 0
  labels, mask = training.branch_targets(sample, first_bit)
  assert labels.tolist() == [float(j == 3) for j in range(20)] and not mask[:2].any()
  logits = jnp.asarray([3.0, -3.0, 0.0])
  loss = training.weighted_bce(logits, jnp.asarray([1.0, 0.0, 0.0]), jnp.asarray([1, 1, 0]))
  assert float(loss) == pytest.approx(float(np.log1p(np.exp(-3.0))), rel=1e-5)


def test_solve_from_mps_is_feasible_with_c_dot_x(tmp_path):
  mip = instances.generate("intcover", 5, num_rows=15, num_cols=30, density=0.2)
  path = tmp_path / "instance.mps"
  mip.write_mps(path)
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2))
  trained = lns.Trained(policy, {"destroy_bt": params, "branch": params,
                                 "destroy_whole": params, "branch_whole": params})
  lns.save_trained(trained, str(tmp_path / "intcover.npz"))
  spec = lns.LnsSpec(sub_node_limit=50, max_steps=3)
  for method in ("btbs", "random_lns", "btbs_no_bt"):
    objective, x, trace = lns.solve(str(path), method=method, time_limit=None,
                                    policy="intcover", spec=spec, policy_dir=str(tmp_path))
    assert mip.is_feasible(x), method
    assert objective == pytest.approx(float(np.dot(mip.c, x)))
    assert trace[-1][1] == pytest.approx(objective)


def test_bad_inputs_fail_before_solving(tmp_path):
  garbage = tmp_path / "garbage.mps"
  garbage.write_text("this is not an MPS file\n")
  with pytest.raises(ValueError, match="garbage.mps"):
    lns.solve(str(garbage), method="random_lns", time_limit=5.0)
  with pytest.raises(ValueError, match="does not exist"):
    lns.solve(str(tmp_path / "missing.mps"), method="scip", time_limit=5.0)
  with pytest.raises(ValueError, match="unknown policy family 'knapsack'"):
    lns.solve(str(garbage), method="btbs", time_limit=5.0, policy="knapsack")
  with pytest.raises(ValueError, match="must exceed the sub-MIP limit"):
    lns.solve(str(garbage), method="btbs", time_limit=1.0, policy="intcover")
  with pytest.raises(ValueError, match="unknown method"):
    lns.solve(str(garbage), method="gurobi", time_limit=5.0)


def test_summary_pairs_methods_per_seeded_run_and_takes_z_star_over_all_runs():
  from experiments import btbs_lns as experiment   # pylint: disable=g-import-not-at-top
  from jaxlab.core import config as config_lib      # pylint: disable=g-import-not-at-top
  config = config_lib.load_config("configs/btbs_lns.py", "smoke")
  s = experiment.settings(config_lib.override(config, {"data.run_seeds": 2,
                                                       "methods": "scip,random_lns"}))
  assert experiment.run_keys(s) == [(2000, "2000"), (2000, "2000-seed1"), (2001, "2001"),
                                    (2001, "2001-seed1")]
  record = lambda objective: {"objective": objective, "trace": [(0.5, objective)], "steps": 1,
                              "feasible": True, "policy_s": 0.0, "solver_s": 1.0,
                              "dual_gap": 0.0}
  objectives = {"2000": (10.0, 12.0), "2000-seed1": (11.0, 9.0), "2001": (5.0, 5.0),
                "2001-seed1": (5.0, 4.0)}
  runs = {key: {"scip": record(a), "random_lns": record(b)} for key, (a, b) in objectives.items()}
  summary = experiment.summarise_family(runs, s)
  assert summary["best_objective"] == [9.0, 4.0]          # over methods and seeds
  gaps = summary["random_lns"]["primal_gap"]
  np.testing.assert_allclose(gaps["per_run"], [0.25, 0.0, 0.2, 0.0])
  np.testing.assert_allclose(gaps["per_instance"], [0.125, 0.1])
  with pytest.raises(config_lib.ConfigError, match="data.run_seeds"):
    experiment.settings(config_lib.override(config, {"data.run_seeds": 0}))


def test_reinforce_events_episode_and_update_direction():
  events, mask = reinforce.action_events(np.array([1, 3, 0]), np.array([3, 3, 0]), 4,
                                         whole=False)
  np.testing.assert_array_equal(events, [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 1, 1, 0], [0, 0, 0, 0]])
  events, mask = reinforce.action_events(np.array([0, 3]), np.array([3, 3]), 4, whole=True)
  np.testing.assert_array_equal(events[:, 0], [1, 0])
  assert mask.sum() == 2 and mask[:, 0].all()

  mip = small_integer_mip(seed=3, n=10, m=4, upper=7)
  static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), 4)
  policy, params = policy_lib.Policy.create(policy_lib.PolicySpec(width=8, num_heads=2,
                                                                  max_bits=4))
  bucket = features.bucket_of(features.graph_at(static, mip.col_upper))
  spec = reinforce.ReinforceSpec(iterations=1, episode_steps=3, sub_time_limit=None,
                                 sub_node_limit=NODES)
  transitions = reinforce.episode(mip, static, policy, params, bucket, destroy_rate=0.3,
                                  whole=False, spec=spec, start="first", start_time_limit=5.0,
                                  rng=np.random.default_rng(0), seed=0)
  assert len(transitions) == 3 and all(t.reward >= 0 for t in transitions)
  assert all(np.all(t.events <= t.mask) and t.events.sum() >= 1 for t in transitions)

  # Probability moves from the unrewarded step's neighbourhood to the rewarded one's.
  rewarded, plain = transitions[0], transitions[1]
  rewarded.reward, plain.reward = 1.0, 0.0
  if np.array_equal(rewarded.events, plain.events):
    plain.events = np.roll(plain.events, 1, axis=0) * plain.mask
  log_prob = lambda p, t: -float(jnp.sum(optax.sigmoid_binary_cross_entropy(
      policy_lib.jitted_logits(policy, p, t.graph)[0], t.events) * t.mask))
  before = (log_prob(params, rewarded), log_prob(params, plain))
  optimizer = optax.adam(1e-2)
  state, opt_state = params, optimizer.init(params)
  for _ in range(5):
    state, opt_state, mean_reward = reinforce.update(policy, optimizer, state, opt_state,
                                                     [rewarded, plain])
  assert mean_reward == 0.5
  assert (log_prob(state, rewarded) - log_prob(state, plain)) > (before[0] - before[1]) + 0.5
  with pytest.raises(ValueError, match="episode_steps"):
    reinforce.ReinforceSpec(episode_steps=1)

