"""`python -m xrt {run,bench,serve,config} [-m] [--config-name NAME] [overrides]`, `python -m xrt bench report DIR`.

Subcommands other than `config` live in `xrt.cli.<name>_cmd` and are imported only when used,
so `config` and `--help` stay fast (no torch, Hydra only when composing)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback

import attrs

from xrt.cli.prompt_args import (
    PROMPT_COMMANDS,
    PromptArgError,
    check_positional,
    is_override,
    prompt_overrides,
    strings_help,
)
from xrt.config import XrtConfig
from xrt.distributed.errors import WorkerFailed
from xrt.log import set_level
from xrt.reflect import ConfigError
from xrt.reflect.suggest import did_you_mean

COMMANDS = {
    "run": "generate from `prompt` (or `prompts_file`) with the configured model",
    "bench": "measure TTFT/TPOT per batch (conf/bench.yaml; sweep with -m); `bench report DIR`: a sweep's table",
    "profile": "where a step's time goes: per-kernel GPU time and host overhead (profile.*; bench config)",
    "serve": "OpenAI-compatible HTTP server",
    "config": "show|validate|schema|fields: print or check the composed config",
}
DEFAULT_CONFIG = {"bench": "bench", "profile": "bench"}
USAGE = ("usage: python -m xrt {run,bench,profile,serve,config} [-m] [-v|-q] [--config-name NAME] [key=value ...]"
         " [PROMPT|-]")
# -v / -q are the log_level field: appended as its override, so `config show` prints the level a run uses.
LOG_FLAGS = {"-v": "debug", "--verbose": "debug", "-q": "warning", "--quiet": "warning"}
# Every environment variable xrt reads (behaviour switches are config fields, not variables).
ENVIRONMENT = {
    "XRT_DEBUG": "1: tracebacks for config and input errors",
    "XRT_CACHE_DIR": "where the tiny checkpoint is made, and L2 KV chunks without cache.l2.path "
                     "(default $XDG_CACHE_HOME/xrt or ~/.cache/xrt)",
    "XRT_CONF_DIR": "a conf/ directory used instead of the shipped one",
    "XRT_GIT_COMMIT": "bench: the commit recorded with results (a tree copied without .git)",
    "TRITON_INTERPRET": "1: Triton kernels run in the interpreter (CPU tests); PDL is off",
    "RANK": "set by torchrun: this process's rank (log prefixes; a rank other than 0 serves rank 0's steps)",
    "WORLD_SIZE": "set by torchrun: the number of ranks (must equal parallel.tp); with RANK, xrt spawns no workers",
    "LOCAL_RANK": "set by torchrun: the CUDA device of this rank on its host",
    "LOCAL_WORLD_SIZE": "set by torchrun: the ranks on this host (cache.l1.size_gb is checked for each of them)",
    "NIXL_LOG_LEVEL": "NIXL's log level (cache=l1_l2; default here: WARN, on stderr)",
    "AWS_DEFAULT_BUCKET": "cache.l2.backend=OBJ: the bucket when cache.l2.backend_params has none (NIXL's too)",
}


class UsageError(Exception):
    pass


@attrs.define
class Invocation:
    command: str
    action: str | None = None
    multirun: bool = False
    config_name: str | None = None
    as_json: bool = False
    help: bool = False
    log_level: str | None = None
    overrides: list[str] = attrs.Factory(list)
    prompt: str | None = None  # positional (run, config); "-": read stdin


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    _tolerant_output()
    try:
        return _main(args)
    except ConfigError as e:
        _debug_traceback()
        for line in e.lines():
            print(f"error: {line}", file=sys.stderr)
        return 2
    except (UsageError, PromptArgError) as e:
        _debug_traceback()
        print(f"error: {e}\n{USAGE}\n(python -m xrt --help lists commands, options and fields)", file=sys.stderr)
        return 2
    except WorkerFailed as e:
        # A rank other than 0 died or raised: its own traceback is on stderr already; here the one line.
        _debug_traceback()
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # `xrt config show | head`: the reader left; exit quietly as SIGPIPE would.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141


def _tolerant_output() -> None:
    """A character the terminal's encoding lacks (PYTHONIOENCODING=ascii, a latin-1 locale) is printed escaped
    (\\u00e9), as Python's stderr does, rather than failing the run with UnicodeEncodeError mid-output."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            try:
                reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a closed or detached stream: nothing to print to anyway
                pass


def _main(args: list[str]) -> int:
    if not args:
        raise UsageError("no command given")
    if args[0] in ("-h", "--help"):
        print(full_help())
        return 0
    if args[0] == "--version":
        from xrt import __version__

        print(__version__)
        return 0
    if args[:2] == ["bench", "report"]:
        from xrt.bench.report import main as report

        return report(args[2:])
    inv = parse_args(args)
    if inv.help:
        print(full_help(inv.command))
        return 0
    if inv.command == "config":
        return _config(inv)
    return _dispatch(inv)


def parse_args(args: list[str]) -> Invocation:
    command = args[0]
    if command not in COMMANDS:
        hint = did_you_mean(command, COMMANDS)
        raise UsageError(f"unknown command {command!r}{hint}; commands: {', '.join(COMMANDS)}")
    inv = Invocation(command)
    rest = iter(args[1:])
    for tok in rest:
        if tok == "--":
            inv.overrides.extend(rest)
        elif tok in ("-m", "--multirun"):
            inv.multirun = True
        elif tok in LOG_FLAGS:
            inv.log_level = LOG_FLAGS[tok]
        elif tok in ("-h", "--help"):
            inv.help = True
        elif tok in ("--config-name", "-cn"):
            inv.config_name = next(rest, None)
            if not inv.config_name:
                raise UsageError(f"{tok} needs a value (a .yaml file name in conf/, e.g. bench)")
        elif tok.startswith("--config-name="):
            inv.config_name = tok.split("=", 1)[1]
        elif tok == "--json" and command == "config":
            inv.as_json = True
        elif tok == "-" and command in PROMPT_COMMANDS and (command != "config" or inv.action is not None):
            inv.prompt = check_positional(tok, inv.prompt)
        elif tok.startswith("-"):
            raise UsageError(f"unknown option {tok!r}")
        elif command == "config" and inv.action is None and "=" not in tok and tok[:1] not in "+~":
            inv.action = tok
        elif command in PROMPT_COMMANDS and not is_override(tok):
            inv.prompt = check_positional(tok, inv.prompt)
        else:
            inv.overrides.append(tok)
    return inv


def _config(inv: Invocation) -> int:
    from xrt.cli import config_cmd

    if inv.action not in config_cmd.ACTIONS:
        given = "no action given" if inv.action is None else f"unknown action {inv.action!r}"
        hint = did_you_mean(inv.action, config_cmd.ACTIONS) if inv.action else ""
        raise UsageError(f"xrt config: {given}{hint}; actions: {', '.join(config_cmd.ACTIONS)}")
    if inv.action in ("schema", "fields"):
        if inv.overrides or inv.prompt is not None:
            given = " ".join([*inv.overrides, *([inv.prompt] if inv.prompt is not None else [])])
            raise UsageError(f"xrt config {inv.action} takes no overrides, got {given}")
        print(config_cmd.schema() if inv.action == "schema" else config_cmd.fields())
        return 0
    config_name = inv.config_name or "config"
    # validate checks what the command of this config would check before loading a model (xrt.cli.machine).
    command = "bench" if config_name == "bench" else "run"
    if not inv.multirun:
        cfg = _compose_one(_overrides(inv), config_name)
        if inv.action == "validate":
            from xrt.cli.machine import command_problems, machine_warnings

            problems = command_problems(cfg, command)
            if problems:
                raise ConfigError(problems)
            for line in machine_warnings(cfg):
                print(f"warning: {line}", file=sys.stderr)
        print("ok" if inv.action == "validate" else config_cmd.show(cfg, as_json=inv.as_json))
        return 0
    from xrt.cli.multirun import check_jobs, planned

    # The jobs the multirun would run (for a sampling sweeper, the values it may pick), each checked.
    p = planned(command if inv.action == "validate" else inv.command, _overrides(inv), config_name)
    if inv.action == "validate":
        check_jobs(command, p)
        if not p.plan.local:
            print(f"note: machine checks skipped: {p.plan.launcher} runs the jobs elsewhere (each job checks its "
                  "own machine as it starts)", file=sys.stderr)
    for label, cfg in zip(p.labels, p.cfgs, strict=True):
        if inv.action == "validate":
            print(f"{label}: ok")
        else:
            print(f"# {label}")
            print(config_cmd.show(cfg, as_json=inv.as_json))
    return 0


def _dispatch(inv: Invocation) -> int:
    module_name = f"xrt.cli.{inv.command}_cmd"
    if importlib.util.find_spec(module_name) is None:
        print(f"xrt {inv.command}: not available yet", file=sys.stderr)
        return 2
    config_name = inv.config_name or DEFAULT_CONFIG.get(inv.command, "config")
    if inv.multirun:
        from xrt.cli import multirun

        return multirun.main(inv.command, _overrides(inv), config_name)
    cfg = _compose_one(_overrides(inv), config_name)
    from xrt.cli.machine import command_problems

    # Machine and path checks before the model loads: a bad path fails in a second.
    problems = command_problems(cfg, inv.command)
    if problems:
        raise ConfigError(problems)
    from xrt.distributed.env import torchrun_env

    env = torchrun_env()
    if env is not None and env.rank != 0:
        return _serve_rank(cfg)
    module = importlib.import_module(module_name)
    set_level(cfg.log_level.value)
    return int(module.main(cfg) or 0)


def _serve_rank(cfg: XrtConfig) -> int:
    """Under torchrun, ranks other than 0 print nothing: they serve rank 0's steps (rank 0 runs the command)
    until it shuts its runner down."""
    from xrt.distributed.worker import serve_torchrun

    set_level(cfg.log_level.value)
    return serve_torchrun(cfg) if cfg.parallel.tp > 1 else 0


def _overrides(inv: Invocation) -> list[str]:
    overrides = inv.overrides + ([f"log_level={inv.log_level}"] if inv.log_level else [])
    if inv.command in PROMPT_COMMANDS:
        overrides = prompt_overrides(overrides, inv.prompt)
    return overrides


def _compose_one(overrides: list[str], config_name: str) -> XrtConfig:
    from xrt.config.compose import load_config

    return load_config(overrides, config_name=config_name)


def full_help(command: str | None = None) -> str:
    from xrt.cli.config_cmd import ACTIONS, fields
    from xrt.config.compose import config_names, group_options, unbuilt_options

    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, text in COMMANDS.items()]
    if command == "config":
        lines += ["", "xrt config actions:"] + [f"  {a:<8} {t}" for a, t in ACTIONS.items()]
    lines += [
        "",
        "options:",
        "  -m, --multirun       Hydra's multirun: `executor=eager,cudagraph bench.batch=1,8` runs one job per",
        "                       combination; hydra/launcher=joblib|submitit_local|submitit_slurm, hydra/sweeper=optuna",
        "                       (the `sweep` extra), hydra.sweep.dir=DIR (bench: <bench.out_dir>/<date>_<time>)",
        f"  --config-name NAME   primary config in conf/ ({', '.join(config_names())}); bench uses `bench`",
        "  -v, --verbose        debug log lines (= log_level=debug)",
        "  -q, --quiet          warnings and errors only (= log_level=warning)",
        "  --json               config show: JSON instead of YAML",
        "  -h, --help           this help",
        "",
        "overrides (Hydra syntax): key=value, group=option, key=[a,b] (list), +key=value (add), ~key (delete)",
        *strings_help(),
        "",
        "groups:",
    ]
    unbuilt = unbuilt_options()
    lines += [
        f"  {g:<10} {', '.join(o + (' (not built yet)' if (g, o) in unbuilt else '') for o in opts)}"
        for g, opts in group_options().items()
    ]
    lines += ["", "fields:", fields(), "", "environment (read by xrt; every behaviour switch is a field above):"]
    lines += [f"  {name:<18} {text}" for name, text in ENVIRONMENT.items()]
    return "\n".join(lines)


def _debug_traceback() -> None:
    if os.environ.get("XRT_DEBUG", "") not in ("", "0"):
        traceback.print_exc()
