"""Applying a trained model to imagery: `vcloud predict` (georeferenced Cloud-Optimized GeoTIFFs,
resumable) and `vcloud bundle` (the weights with their config and model card).

- plan.py: which (location, date) images are reconstructed, from which input dates; batches.
- geo.py: writing COGs and the per-ROI VRT mosaics (rasterio, rio-cogeo).
- manifest.py: the provenance and per-output status and checksum that a rerun resumes from.
- run.py: `vcloud predict`.
- bundle.py: `vcloud bundle` and reading a bundle back.
"""
