"""Statistically robust WDRO (Liu et al., ICLR 2025): a Wasserstein soft-ball attack and KL worst-case reweighting against robust overfitting."""
