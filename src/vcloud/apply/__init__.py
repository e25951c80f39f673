"""Applying a trained model to imagery: `vcloud predict` (georeferenced Cloud-Optimized GeoTIFFs,
resumable; docs/predict.md).

- plan.py: which (location, date) images are reconstructed, from which input dates; batches.
- geo.py: writing COGs and the per-ROI VRT mosaics (rasterio, rio-cogeo).
- manifest.py: the provenance and per-output status and checksum that a rerun resumes from.
- run.py: `vcloud predict`.
"""
