"""Evaluation of the stages on a prepared store (`vcloud evaluate`), used by the viewer too.

- protocols.py:  the samples of each protocol (fixed: seeded synthetic clouds; reference:
                 least-cloudy date as ground truth)
- predict.py:    one predictor per kind of stage, built from explicit checkpoint paths
                 (registry.Stage.predictor names which)
- scoring.py:    metrics of the model and the baselines on the same samples, per cloud class
- evaluate.py:   the `vcloud evaluate` entry: protocols -> scores -> results/eval/stage<n>.json
- metrics.py:    PSNR, SSIM, SAM, MAE, RMSE as UnCRtainTS defines them
- baselines.py:  least-cloudy date and median mosaic
"""
