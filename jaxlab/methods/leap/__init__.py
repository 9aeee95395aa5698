"""leap: LLM agents that learn from privileged AI feedback (Choudhury & Sodhi, ICLR 2025), on a\ngenerated text game with written-out teachers."""
