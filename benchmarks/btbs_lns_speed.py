"""btbs_lns speed: the policy's cost per LNS step against SCIP's.

  python -m benchmarks.btbs_lns_speed [--preset=quick] [--no-append] [--brief]

Per family of the preset (its instance sizes): building the graph at an incumbent (NumPy), one
jitted trunk and destroy head pass (warm; the graph padded to its bucket, once per incumbent), one
host branch head call on its embeddings (every btbs step), and one LNS run of each learned
method and random LNS under the preset's wall clock, split into setup (model, first solution,
LP relaxation), policy (features, GNN, neighbourhood) and SCIP time, with LNS steps per second.
The issue's target: the policy under 10% of a step. Learned methods use the committed policy
`results/btbs_lns_policies/<family>.npz` when it exists (else an untrained network of the same
size: the timing is the same). Prints, and writes to benchmarks/RESULTS.md (not under --brief).
"""
from __future__ import annotations

import os

import jax
import numpy as np

from benchmarks.common import brief_mark, cut, machine, preset_command_line, publish, time_call, writes_results
from experiments import btbs_lns as btbs_experiment
from jaxlab.methods.btbs_lns import features
from jaxlab.methods.btbs_lns import host_branch
from jaxlab.methods.btbs_lns import instances
from jaxlab.methods.btbs_lns import lns
from jaxlab.methods.btbs_lns import policy as policy_lib
from jaxlab.methods.btbs_lns import solvers


def trained_or_fresh(family: str, spec: policy_lib.PolicySpec) -> tuple[lns.Trained, str]:
  path = os.path.join(lns.POLICY_DIR, f"{family}.npz")
  if os.path.exists(path):
    trained = lns.load_trained(path)
    if trained.policy.spec == spec:
      # The published files hold btbs's networks only; btbs_no_bt's have the same structure,
      # so btbs's time them.
      trained.params.setdefault("destroy_whole", trained.params["destroy_bt"])
      trained.params.setdefault("branch_whole", trained.params["branch"])
      return trained, "trained"
  policy, params = policy_lib.Policy.create(spec)
  return lns.Trained(policy, {key: params for key in ("destroy_bt", "branch", "destroy_whole",
                                                      "branch_whole")}), "untrained"


def main() -> None:
  args, config = preset_command_line("btbs_lns")
  s = btbs_experiment.settings(config)
  time_limit = s.time_limit or 2.0
  spec = s.lns if s.time_limit else lns.LnsSpec(
      destroy_rate=s.lns.destroy_rate, sub_time_limit=0.5, branch_share=s.lns.branch_share,
      start=s.lns.start, start_share=s.lns.start_share)
  lines = [f"\n## btbs_lns policy and LNS step costs ({args.preset} preset), "
           f"{machine()}{brief_mark(args)}\n\n",
           f"One thread per solver; GNN width {s.policy.width}, {s.policy.rounds} round(s); "
           f"{time_limit:g} s per run, sub-MIPs at most {spec.sub_time_limit:g} s, destroy rate "
           f"{spec.destroy_rate}. Policy share = policy / (policy + SCIP) time within the LNS "
           "loop (target: under 10%).\n\n",
           "| family | size (cols x rows, nnz) | graph build | trunk + destroy | branch head "
           "| method | LNS steps/s | setup s | policy s | SCIP s | policy share |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n"]
  for family in s.families:
    mip = instances.generate(family, s.test_seeds[0], **s.sizes[family])
    trained, kind = trained_or_fresh(family, s.policy)
    static = features.StaticFeatures.of(mip, solvers.lp_relaxation(mip), s.policy.max_bits)
    x = solvers.first_solution(mip).x
    build = time_call(lambda: features.pad(features.graph_at(static, x)),
                      repeats=cut(args, 20, 2))
    graph = features.pad(features.graph_at(static, x))
    network = policy_lib.bind(trained.policy, trained.params["destroy_bt"])
    forward = time_call(lambda: network(graph), repeats=cut(args, 20, 2))
    head = host_branch.BranchHead.of(policy_lib.network(trained.policy, trained.params["branch"]))
    prepared = head.prepare(jax.device_get(network(graph)[0]))
    incidence = host_branch.Incidence.of(graph)
    released = np.arange(graph.variables.shape[0]) % 5 == 0
    branch = time_call(lambda: head.logits(prepared, incidence, released),
                       repeats=cut(args, 20, 2))
    size = f"{mip.num_cols} x {mip.num_rows}, {len(mip.data)}"
    for method in ("random_lns", "btbs", "btbs_no_bt", "btbs_no_branch"):
      timing = lns.Timing()
      run = lns.run(mip, method, time_limit=time_limit, spec=spec, trained=trained,
                    timing=timing)
      loop = timing.policy_s + timing.solver_s
      share = timing.policy_s / max(loop, 1e-9)
      lines.append(f"| {family} | {size} | {build * 1e3:.1f} ms | {forward * 1e3:.1f} ms "
                   f"({kind}) | {branch * 1e3:.2f} ms | {method} | "
                   f"{run.steps / max(loop, 1e-9):.1f} | "
                   f"{timing.setup_s:.2f} | {timing.policy_s:.2f} | {timing.solver_s:.2f} | "
                   f"{100 * share:.0f}% |\n")
      print(lines[-1], end="", flush=True)
  jax.clear_caches()
  publish(lines, "btbs_lns", writes_results(args))


if __name__ == "__main__":
  main()
