"""Evaluation of the stages on a prepared store (`vcloud evaluate`), used by the viewer too.

- protocols.py:  the samples of each protocol (fixed: seeded synthetic clouds; reference:
                 least-cloudy date as ground truth)
- uncrtaints.py: protocol uncrtaints, the published one (the reference loader's fixed sampler,
                 regions, the released pairing files read without unpickling code)
- predict.py:    one predictor per kind of stage, built from explicit checkpoint paths
                 (registry.Stage.predictor names which)
- scoring.py:    metrics of the model and the baselines on the same samples, per cloud class,
                 and the paired differences model - baseline; the report's tables
- evaluate.py:   the `vcloud evaluate` entry: protocols -> scores -> results/eval/stage<n>.json
- metrics.py:    PSNR, SSIM, SAM, MAE, RMSE as UnCRtainTS defines them
- baselines.py:  least-cloudy date and median mosaic
- nearest_clear.py: the nearest-clear-date baseline
- stats.py:      paired standard errors (per sample and clustered by location), bootstrap
"""
