"""What a multirun (`-m`) will run, worked out before it runs, so that every job's config is checked first.

`plan_sweep` puts the overrides in Hydra's syntax (`xrt.config.verbatim.sweep_overrides`, `precheck`),
composes the multirun's own config with Hydra (which sweeper and launcher, `hydra.sweeper.params`,
`hydra.sweep.dir`) and lists the jobs: for Hydra's basic sweeper exactly the jobs it will launch, in its order
(its own `BasicSweeper.split_arguments`), so job i is Hydra's job number i; for a sweeper that samples
(Optuna, Nevergrad, Ax) the values it may pick, one axis at a time with the others at their first value (every
choice, a range's or an interval's ends): the search space's bounds are checked, not every combination."""

from __future__ import annotations

import itertools
from typing import Any

import attrs

from xrt.config.compose import config_names, group_options, parse_overrides, precheck
from xrt.config.hydra_errors import hydra_problems
from xrt.config.verbatim import quote, sweep_overrides
from xrt.reflect import ConfigError, Problem

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
# Launchers whose jobs run on this machine: its CUDA and paths are theirs, so the machine checks run here first.
LOCAL_LAUNCHERS = frozenset({
    BASIC_LAUNCHER,
    "hydra_plugins.hydra_joblib_launcher.joblib_launcher.JoblibLauncher",
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.LocalLauncher",
})


@attrs.define
class SweepPlan:
    overrides: list[str]  # for Hydra's multirun: Hydra's settings, then the job overrides, in Hydra's syntax
    jobs: list[list[str]]  # each job's overrides (enumerated), else the sampled values to check
    enumerated: bool  # jobs are the sweep's jobs in Hydra's order (the basic sweeper)
    sweeper: str  # the sweeper's _target_
    launcher: str  # the launcher's _target_
    sweep_dir: str  # hydra.sweep.dir, resolved
    directions: list[str]  # a sampling sweeper's hydra.sweeper.direction(s); [] for the basic sweeper
    num_jobs: int | None  # jobs the sweep runs (hydra.sweeper.n_trials for Optuna), when known

    @property
    def local(self) -> bool:
        return self.launcher in LOCAL_LAUNCHERS


def plan_sweep(overrides: list[str], config_name: str, task_name: str) -> SweepPlan:
    """The plan for `-m` with these command-line overrides. Raises `ConfigError` with every problem found in the
    overrides themselves (unknown fields, bad group options, a sweep the sweeper cannot run); the jobs' configs
    are composed and checked by the caller (`xrt.cli.multirun`)."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from xrt.config.hydra_app import hydra_app

    problems: list[Problem] = []
    written = sweep_overrides(overrides, problems)
    parsed = parse_overrides(written, problems)
    rewritten = precheck(parsed, group_options(), config_names(), config_name, problems, sweeps=True)
    # Unknown keys are left out and the rest still planned, so one run reports every mistake.
    if not all(m.startswith("unknown field") for _, m in problems):
        raise ConfigError(problems)
    with hydra_app(task_name) as app:
        try:
            plan = _plan(app, rewritten, config_name, problems)
        except (HydraException, OmegaConfBaseException, ValueError, KeyError) as e:
            problems.extend(hydra_problems(e, rewritten))
    if problems:
        raise ConfigError(problems)
    return plan


def _plan(app: Any, rewritten: list[str], config_name: str, problems: list[Problem]) -> SweepPlan:
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    hydra = app.compose_config(config_name, rewritten, run_mode=RunMode.MULTIRUN).hydra
    sweeper = str(hydra.sweeper._target_)
    params = OmegaConf.to_container(hydra.sweeper.params, resolve=True) if hydra.sweeper.get("params") else {}
    # As the sweepers do: hydra.sweeper.params first, then the command line's overrides of the job.
    args = [f"{k}={v}" for k, v in (params or {}).items()] + list(hydra.overrides.task)
    precheck(parse_overrides(args, problems), group_options(), config_names(), config_name, problems, sweeps=True)
    # Globs over group options need Hydra's config loader.
    parsed = OverridesParser.create(config_loader=app.config_loader).parse_overrides(args)
    basic = sweeper == BASIC_SWEEPER
    jobs = _enumerate(parsed) if basic else _sample_points(parsed)
    n_trials = hydra.sweeper.get("n_trials")
    # Resolved once here: `${now:...}` in a later composition would name another directory.
    sweep_dir = str(hydra.sweep.dir)
    return SweepPlan(
        overrides=[*rewritten, f"hydra.sweep.dir={quote(sweep_dir)}"], jobs=jobs, enumerated=basic, sweeper=sweeper,
        launcher=str(hydra.launcher._target_), sweep_dir=sweep_dir,
        directions=[] if basic else _directions(hydra.sweeper.get("direction")),
        num_jobs=len(jobs) if basic else int(n_trials) if n_trials is not None else None,
    )


def _enumerate(parsed: list[Any]) -> list[list[str]]:
    """The basic sweeper's jobs, as it makes them."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.errors import HydraException

    for o in parsed:
        if o.is_sweep_override() and not o.is_discrete_sweep():
            raise HydraException(f"'{o.input_line}': the basic sweeper runs a,b,c / range() / glob() sweeps; "
                                 f"interval() needs a sweeper that samples, e.g. hydra/sweeper=optuna")
    (batch,) = BasicSweeper.split_arguments(parsed, None)
    return [list(job) for job in batch]


def _sample_points(parsed: list[Any]) -> list[list[str]]:
    """Overrides that put each sampled axis at each of its checked values, the others at their first."""
    axes: dict[str, list[str]] = {}
    for o in parsed:
        key = o.get_key_element()
        axes[key] = [f"{key}={v}" for v in _checked_values(o)] if o.is_sweep_override() else [o.input_line]
    first = {k: v[0] for k, v in axes.items() if v}
    jobs = [list(first.values())]
    for key, values in axes.items():
        for value in values[1:]:
            jobs.append([value if k == key else v for k, v in first.items()])
    return [list(j) for j, _ in itertools.groupby(jobs)]


def _checked_values(o: Any) -> list[str]:
    """A sampled sweep's values worth composing: every choice; a range's start and stop (Optuna's integer
    ranges include the stop); an interval's ends."""
    from hydra.core.override_parser.types import IntervalSweep, RangeSweep

    value = o.value()
    if isinstance(value, IntervalSweep):
        return [str(value.start), str(value.end)]
    if isinstance(value, RangeSweep) and not value.shuffle:
        return [str(value.start), str(value.stop)]
    return list(o.sweep_string_iterator())


def _directions(direction: Any) -> list[str]:
    if direction is None:
        return []
    items = list(direction) if not isinstance(direction, str) and hasattr(direction, "__iter__") else [direction]
    return [str(getattr(d, "name", d)) for d in items]


__all__ = ["BASIC_SWEEPER", "LOCAL_LAUNCHERS", "SweepPlan", "plan_sweep"]
