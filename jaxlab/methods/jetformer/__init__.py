"""jetformer: JetFormer, an autoregressive model of raw images over Jet-flow soft tokens (ICLR 2025)."""
