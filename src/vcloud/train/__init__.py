"""Training: the trainer loop, checkpoints, records, the stage builders and distributed set-up."""
