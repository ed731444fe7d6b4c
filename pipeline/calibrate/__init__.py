"""Judging and fitting the cost model on evidence: operator measurements and a fleet's own logs.

``validate`` judges the cost model on measurements it was not built from (``rooftrace
validate``); ``measurements`` fits a GPU's roofline factors or builds measured profiles from
operator tables (``rooftrace calibrate``); ``observed`` reads the latencies a real fleet
delivered from its logs and ``observed_fit`` learns a serving stack's calibration from them by
replaying the day (``rooftrace calibrate --observed``).

Public entry: :func:`calibrate`, :func:`run_validation` and :func:`fit_store`.
"""

from pipeline.calibrate.measurements import calibrate
from pipeline.calibrate.observed_fit import fit_store
from pipeline.calibrate.validate import run_validation

__all__ = ["calibrate", "fit_store", "run_validation"]
