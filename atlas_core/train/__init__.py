"""Training: on-the-fly tasks, the trainer and checkpoints."""
