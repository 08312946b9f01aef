"""`-m`: a command's jobs through Hydra's own multirun, so its sweepers (basic, Optuna, ...) and launchers (basic,
joblib, submitit, ...) run them and `hydra/launcher=...`, `hydra/sweeper=...`, `hydra.sweep.dir`,
`hydra.sweeper.params` work as Hydra documents. Each job gets a directory under the sweep directory with Hydra's
.hydra/config.yaml and overrides.yaml; a bench job writes its results.jsonl there and returns its objective to
the sweeper, and the sweep's combined table and plot are built at the end (`xrt.bench.report.combine`).

Before the first job runs, every job's config is composed and checked (`xrt.config.sweep.plan_sweep` lists
them), with the machine checks when the launcher runs the jobs on this machine: a bad value in one job stops
the sweep at once with every problem, as a single run does. Single runs never come here: they use the compose
API, with no output directory and no logging set up by Hydra."""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from xrt.config import XrtConfig
from xrt.reflect import ConfigError, Problem

if TYPE_CHECKING:
    from xrt.config.sweep import SweepPlan

# Commands whose jobs return a value a sweeper can optimise (bench.objective).
OBJECTIVE_COMMANDS = frozenset({"bench"})


class JobFailed(Exception):
    """A job of the sweep ended with a non-zero status (its error lines went to its stderr). Picklable as
    Hydra's process launchers need: the arguments are the state."""

    def __init__(self, num: int, rc: int) -> None:
        super().__init__(num, rc)
        self.num, self.rc = num, rc

    def __str__(self) -> str:
        return f"job #{self.num} exited with status {self.rc}"


@attrs.define
class SweepJob:
    """Where a multirun job is: Hydra's job number and directory, the sweep's directory, its overrides."""

    num: int
    num_jobs: int | None
    job_dir: Path
    sweep_dir: Path
    overrides: list[str]


@attrs.define
class SweepTask:
    """Hydra's task function: one job's composed config to an `XrtConfig` (the same checks as a single run's),
    then the command. Plain data, so joblib and submitit can send it to their processes."""

    command: str
    num_jobs: int | None
    outputs: dict[int, str] = attrs.Factory(dict)  # run: a job's `output` where jobs would share one file

    def __call__(self, cfg: Any) -> float | None:
        from xrt.cli.job_log import job_log

        with job_log():
            return self._run(cfg)

    def _run(self, cfg: Any) -> float | None:
        from hydra.core.hydra_config import HydraConfig

        from xrt.log import set_level

        hc = HydraConfig.get()
        num = int(hc.job.num)
        overrides = [str(o) for o in hc.overrides.task]
        try:
            xcfg = job_config(cfg, overrides)
            if num in self.outputs:
                xcfg = attrs.evolve(xcfg, output=self.outputs[num])
            # Again here: with a launcher that runs jobs elsewhere, this is the machine that runs them.
            from xrt.cli.machine import command_problems, machine_problems

            problems = machine_problems(xcfg) if self.command == "bench" else command_problems(xcfg, self.command)
            if problems:
                raise ConfigError(problems)
        except ConfigError as e:
            for line in e.lines():
                print(f"error: {line}", file=sys.stderr)
            raise JobFailed(num, 2) from None
        set_level(xcfg.log_level.value)
        module = importlib.import_module(f"xrt.cli.{self.command}_cmd")
        value = None
        if self.command == "bench":
            job = SweepJob(num, self.num_jobs, Path(hc.runtime.output_dir), Path(hc.sweep.dir), overrides)
            rc, value = module.sweep_job(xcfg, job)
        else:
            rc = module.main(xcfg)
        if rc:
            raise JobFailed(num, int(rc))
        return value


def job_config(cfg: Any, overrides: list[str]) -> XrtConfig:
    """The `XrtConfig` of a job Hydra composed (an OmegaConf DictConfig), checked as `load_config` checks."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from xrt.config.compose import config_from_raw, explicit_keys, parse_overrides
    from xrt.config.hydra_errors import hydra_problems

    try:
        raw = OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except (OmegaConfBaseException, ValueError, KeyError) as e:
        raise ConfigError(hydra_problems(e, overrides)) from e
    assert isinstance(raw, dict)
    return config_from_raw(raw, explicit_keys(parse_overrides(overrides, [])))


@attrs.define
class Planned:
    plan: SweepPlan
    cfgs: list[XrtConfig]  # per entry of plan.jobs, checked
    labels: list[str]


def planned(command: str, overrides: list[str], config_name: str) -> Planned:
    """The sweep's plan and every job's checked config (for a sampling sweeper: the values it may pick).
    Raises `ConfigError` with every problem, each job's marked `[job #i of n]` (Hydra's job.num, from 0)."""
    from xrt.cli.paths import separate_outputs, sweep_problems
    from xrt.config.compose import compose_overrides
    from xrt.config.sweep import plan_sweep

    plan = plan_sweep(overrides, config_name, command)
    cfgs: list[XrtConfig] = []
    found: list[list[Problem]] = []
    for job in plan.jobs:
        try:
            cfgs.append(compose_overrides(job, config_name))
            found.append([])
        except ConfigError as e:
            found.append(e.problems)
    raise_all(found, plan.jobs, plan.enumerated)
    if plan.enumerated:
        cfgs = separate_outputs(cfgs)
        raise_all(sweep_problems(cfgs), plan.jobs, True)
    labels = [job_label(i, len(plan.jobs), job, plan.enumerated) for i, job in enumerate(plan.jobs)]
    return Planned(plan, cfgs, labels)


def main(command: str, overrides: list[str], config_name: str) -> int:
    """Check every job, then run the multirun; the first failed job's status (0 when all succeeded)."""
    from xrt.cli.job_log import sweep_logging
    from xrt.config.hydra_app import hydra_app

    p = planned(command, overrides, config_name)
    plan = p.plan
    check_jobs(command, p)
    outputs = {i: c.output for i, c in enumerate(p.cfgs) if c.output} if plan.enumerated else {}
    task = SweepTask(command, plan.num_jobs, outputs)
    status = 0
    try:
        with hydra_app(command) as app, _logging_restored(), sweep_logging(plan.sweeper):
            try:
                app.multirun(config_name, task, plan.overrides, with_log_configuration=True)
            except JobFailed as e:
                status = e.rc
    finally:
        # The jobs that finished make the table, also when one failed or the sweep was interrupted.
        if command == "bench" and Path(plan.sweep_dir).is_dir():
            from xrt.bench.report import combine

            for line in combine(Path(plan.sweep_dir)):
                print(f"[bench] {line}", flush=True)
    return status


def check_jobs(command: str, p: Planned) -> None:
    """Every job's problems and the sweep's own (`job_problems`, `_sweep_problems`, the sweep directory) as one
    `ConfigError`: what `main` checks before the first job loads a model, and `config validate -m` too."""
    from xrt.cli.paths import sweep_dir_problems

    sweep = _sweep_problems(command, p) + sweep_dir_problems(p.plan.sweep_dir)
    raise_all(job_problems(command, p), p.plan.jobs, p.plan.enumerated, sweep)


def job_problems(command: str, p: Planned) -> list[list[Problem]]:
    """Per job: what `command` would refuse once started, found before any job runs: its paths, and with a
    launcher running the jobs on this machine, the machine checks (`xrt.cli.machine`)."""
    from xrt.cli.machine import machine_problems
    from xrt.cli.paths import CHECKS

    check = _bench_problems if command == "bench" else CHECKS.get(command)
    return [(machine_problems(c) if p.plan.local else []) + (check(c) if check else []) for c in p.cfgs]


def _bench_problems(cfg: XrtConfig) -> list[Problem]:
    """What the bench would refuse once started (lengths past the model): found before any job runs. Its
    out_dir is not checked: a sweep's jobs write under hydra.sweep.dir."""
    from xrt.bench.preflight import scenario_problem

    problem = scenario_problem(cfg)
    if problem is None:
        return []
    path, _, message = problem.partition(": ")
    return [(path, message)]


def _sweep_problems(command: str, p: Planned) -> list[Problem]:
    """What no single job shows: a sampling sweeper with nothing to optimise or the wrong direction, a bench
    sweep over bench.out_dir (its jobs write under hydra.sweep.dir)."""
    from xrt.bench.sweep_results import direction

    plan = p.plan
    problems: list[Problem] = []
    if not plan.enumerated and command not in OBJECTIVE_COMMANDS:
        problems.append(("hydra/sweeper", f"{plan.sweeper} optimises the value a job returns; only "
                                          f"{', '.join(sorted(OBJECTIVE_COMMANDS))} jobs return one (bench.objective)"))
    if command != "bench":
        return problems
    dirs = sorted({c.bench.out_dir for c in p.cfgs})
    if plan.enumerated and len(dirs) > 1:
        problems.append(("bench.out_dir", f"a sweep writes its jobs' results under hydra.sweep.dir "
                                          f"({plan.sweep_dir}), not per job ({', '.join(dirs)}); run one sweep "
                                          f"per directory, with hydra.sweep.dir=DIR"))
    if plan.enumerated:
        return problems
    metrics = {c.bench.objective_metric() for c in p.cfgs}
    if None in metrics:
        problems.append(("bench.objective", "the kernels scenario returns no objective for the sweeper; "
                                            "use bench.scenario=latency, throughput, prefix, multiturn or serve"))
    wanted = sorted({direction(m) for m in metrics if m is not None})
    if len(wanted) == 1 and plan.directions and plan.directions != wanted:
        names = ", ".join(sorted(m.value for m in metrics if m is not None))
        problems.append(("hydra.sweeper.direction", f"bench.objective {names} is to {wanted[0]}, the sweeper is "
                                                    f"set to {', '.join(plan.directions)}; add "
                                                    f"hydra.sweeper.direction={wanted[0]}"))
    return problems


def raise_all(
    found: list[list[Problem]], jobs: list[list[str]], numbered: bool, sweep: list[Problem] | None = None
) -> None:
    """Every job's problems, then the sweep's own, as one `ConfigError`; a problem of some jobs only (of an
    enumerated sweep of more than one) says which by Hydra's job number: `[job #1, #2 of 4]`."""
    if not any(found) and not sweep:
        return
    if not numbered or len(jobs) == 1:
        raise ConfigError(dict.fromkeys([*(p for ps in found for p in ps), *(sweep or [])]))
    where: dict[Problem, list[str]] = {}
    for i, ps in enumerate(found):
        for p in ps:
            where.setdefault(p, []).append(f"#{i}")
    raise ConfigError([
        *((path, msg if len(ids) == len(jobs) else f"{msg} [job {', '.join(ids)} of {len(jobs)}]")
          for (path, msg), ids in where.items()),
        *(sweep or []),
    ])


def job_label(i: int, n: int, job: list[str], numbered: bool = True) -> str:
    # Jobs by Hydra's job.num (from 0, as `[HYDRA] #0`); a sampling sweeper's values are no jobs yet.
    what = f"job #{i} of {n}" if numbered else f"values {i + 1}/{n}"
    return f"{what}: {' '.join(_shown(o) for o in job) if job else '(defaults)'}"


def _shown(override: str) -> str:
    """A string field's Hydra-quoted value as the user would type it (`prompt='Hi!'` -> `prompt=Hi!`)."""
    from hydra.errors import HydraException

    from xrt.config.verbatim import as_override, hydra_parser, split

    parts = split(override)
    if parts is None:
        return override
    try:
        value = hydra_parser().parse_override(override).value()
    except HydraException:
        return override
    return as_override(parts[0], parts[1], value) if isinstance(value, str) else override


@contextmanager
def _logging_restored() -> Iterator[None]:
    """Hydra's multirun sets up logging (its [HYDRA] lines, each job's console and <job dir>/<command>.log);
    afterwards the root logger is as it was, so a caller's (or a test's) logging is not left taken over."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        yield
    finally:
        for h in root.handlers:
            if h not in handlers:
                h.close()
        root.handlers[:] = handlers
        root.setLevel(level)


__all__ = ["JobFailed", "SweepJob", "SweepTask", "check_jobs", "job_config", "job_label", "job_problems", "main",
           "planned", "raise_all"]
