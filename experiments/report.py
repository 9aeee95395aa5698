"""Rebuilds results/REPORT.md and the README's methods table from results/*.json.

  python -m experiments.report
"""
from __future__ import annotations

from jaxlab.core import results

# The nineteen methods, in the order of the project's mission.
METHODS = (
    ("sg_unlearn", "Adversarial Machine Unlearning"),
    ("ctrl", "Adding Conditional Control to Diffusion Models with Reinforcement Learning"),
    ("enamel", "How efficient is LLM-generated code? (ENAMEL, eff@k)"),
    ("lotus", "Lotus: Diffusion-based Visual Foundation Model for Dense Prediction"),
    ("leap", "Better than Your Teacher: LLM Agents that Learn from Privileged AI Feedback"),
    ("reward_reduction", "Reward Dimension Reduction for Scalable Multi-Objective RL"),
    ("sr_wdro", "Mitigating Robust Overfitting in Wasserstein DRO"),
    ("flow_mi", "Flow-based Variational Mutual Information"),
    ("precision_ls", "Towards Learning High-Precision Least Squares Algorithms with Sequence "
                     "Models"),
    ("metametrics", "MetaMetrics: Calibrating Metrics for Generation Tasks"),
    ("neural_spacetimes", "Neural Spacetimes for DAG Representation Learning"),
    ("ise", "Instructional Segment Embedding"),
    ("btbs_lns", "Binarized-Tightening, Branch and Search on Learning LNS Policies for MIP"),
    ("semantix", "Semantix: An Energy-guided Sampler for Semantic Style Transfer"),
    ("diffusion_purification", "Robustness of Diffusion-Based Purification: A Stochastic "
                               "Perspective (ADDT, RBGM)"),
    ("attention_pruning", "Beyond Linear Approximations: Pruning the Attention Matrix"),
    ("jetformer", "JetFormer: An Autoregressive Generative Model of Raw Images and Text"),
    ("freecg", "FreeCG: Free the Design Space of Clebsch-Gordan Transform for Force Fields"),
    ("pico", "PiCO: Peer Review in LLMs based on Consistency Optimization"),
)


def main() -> None:
  for path in results.rebuild(METHODS, results.REPO_ROOT / "README.md"):
    print(f"rebuilt {path.relative_to(results.REPO_ROOT)}")


if __name__ == "__main__":
  main()
