"""Wind-following scan orders: precomputed once to an npz file that every DDP rank reads."""
