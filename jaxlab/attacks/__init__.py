"""Adversarial attacks shared by the methods: L-inf PGD with EOT, FGSM, the soft-ball attack."""
