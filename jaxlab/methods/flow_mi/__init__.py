"""flow_mi: flow-based variational mutual information (Dahlke & Pacheco, ICLR 2025)."""
