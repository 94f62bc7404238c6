"""Experiments end to end: the config, one setting with CalibDCD in the loop, the grid runner and
the paper's analyses.

>>> from calibdcd.experiment import load_config, run_experiment   # doctest: +SKIP
>>> run_dir = run_experiment(load_config("configs/lab-small.yaml"))  # doctest: +SKIP

Importing this package does not import torch; models load only when a setting needs a query.
"""

from calibdcd.experiment.analyses import (
    CalibrationProblem,
    Outcome,
    ablation_configs,
    fixed_config,
    fp_recovery,
    threshold_at_fpr,
)
from calibdcd.experiment.config import ConfigError, ExperimentConfig, load_config, parse_config
from calibdcd.experiment.plan import RunPlan, Setting, materialize, resolve
from calibdcd.experiment.resources import RunContext
from calibdcd.experiment.runner import dry_run, grid, run_experiment
from calibdcd.experiment.setting import (
    PreparedSetting,
    prepare_setting,
    run_analyses,
    run_setting,
)

__all__ = [
    "CalibrationProblem",
    "ConfigError",
    "ExperimentConfig",
    "Outcome",
    "PreparedSetting",
    "RunContext",
    "RunPlan",
    "Setting",
    "ablation_configs",
    "dry_run",
    "fixed_config",
    "fp_recovery",
    "grid",
    "load_config",
    "materialize",
    "parse_config",
    "prepare_setting",
    "resolve",
    "run_analyses",
    "run_experiment",
    "run_setting",
    "threshold_at_fpr",
]
