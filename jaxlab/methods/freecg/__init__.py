"""FreeCG: grouped Clebsch-Gordan transforms on abstract edges (ICLR 2025)."""
