"""sg_unlearn: adversarial machine unlearning as a Stackelberg game (ICLR 2025)."""
