"""Entry points: `python -m experiments.<slug> --config=configs/<slug>.py:<preset>`."""
