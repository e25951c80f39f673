"""Training: trainer loop, checkpoints, curriculum, distributed set-up and metrics."""
