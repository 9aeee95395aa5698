"""neural_spacetimes: Neural Spacetimes for DAG representation learning (Sáez de Ocáriz Borde et
al., ICLR 2025)."""
