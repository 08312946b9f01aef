"""`--help`: `python -m xrt --help` lists every command, option, group, field and environment variable;
`python -m xrt COMMAND --help` only what that command takes: its usage and options, its own fields in full (run's
top-level ones, bench.*, profile.*, serve.*) and the sections every command shares by name, one line each. Both are
built from the schema (`xrt.reflect`), so they name the fields as they are."""

from __future__ import annotations

from collections.abc import Callable

import attrs

COMMANDS = {
    "run": "generate from `prompt` (or `prompts_file`) with the configured model",
    "bench": "measure TTFT/TPOT per batch (conf/bench.yaml; sweep with -m); `bench report DIR`: a sweep's table",
    "profile": "where a step's time goes: per-kernel GPU time and host overhead (profile.*; bench config)",
    "serve": "OpenAI-compatible HTTP server",
    "config": "show|validate|schema|fields: print or check the composed config",
}
USAGE = ("usage: python -m xrt {run,bench,profile,serve,config} [-m] [-v|-q] [--config-name NAME] [key=value ...]"
         " [PROMPT|-]")
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

MULTIRUN = [
    "  -m, --multirun       Hydra's multirun: `executor=eager,cudagraph bench.batch=1,8` runs one job per",
    "                       combination; hydra/launcher=joblib|submitit_local|submitit_slurm, hydra/sweeper=optuna",
    "                       (the `sweep` extra), hydra.sweep.dir=DIR (bench: <bench.out_dir>/<date>_<time>)",
]
VERBOSITY = [
    "  -v, --verbose        debug log lines (= log_level=debug): what start-up built (model, KV cache, engine)",
    "  -q, --quiet          warnings and errors only (= log_level=warning)",
]
JSON = ["  --json               config show: JSON instead of YAML"]
OVERRIDES = "overrides (Hydra syntax): key=value, group=option, key=[a,b] (list), +key=value (add), ~key (delete)"
# What each command's own help shows: its usage tail, whether it sweeps (-m), and which fields are its own.
# Top-level fields whose help starts "run:" are run's; device, log_level and seed are every command's.
COMMON = ("device", "log_level", "seed")
USAGES = {
    "run": "run [-m] [-v|-q] [--config-name NAME] [key=value ...] [PROMPT|-]",
    "bench": "bench [-m] [-v|-q] [--config-name NAME] [key=value ...]\n       python -m xrt bench report DIR",
    "profile": "profile [-m] [-v|-q] [--config-name NAME] [key=value ...]",
    "serve": "serve [-v|-q] [--config-name NAME] [key=value ...]",
    "config": "config {show,validate,schema,fields} [-m] [--json] [--config-name NAME] [key=value ...] [PROMPT|-]",
}
SWEEPS = {"run", "bench", "profile", "config"}


# Sections that are one command's own; the others (model, parallel, executor, cache, scheduler, sampling) are what
# every command that runs the engine reads.
OWN_SECTIONS = ("bench", "profile", "serve")


def _sections() -> dict[str, str]:
    """XrtConfig's sections (its attrs-class fields) and their help."""
    from xrt.config import XrtConfig
    from xrt.reflect.field import help_of

    return {a.name: help_of(a) for a in attrs.fields(attrs.resolve_types(XrtConfig)) if attrs.has(a.type)}


def _own(command: str) -> Callable[[str], bool]:
    """Which dotted paths are `command`'s own fields."""
    from xrt.config import XrtConfig
    from xrt.reflect.field import help_of

    run_fields = {a.name for a in attrs.fields(XrtConfig) if help_of(a).startswith("run:")}
    if command == "run":
        return lambda path: path in COMMON or path in run_fields
    if command in ("bench", "profile", "serve"):
        return lambda path: path in COMMON or path.startswith(f"{command}.")
    return lambda path: path in COMMON


def _common(command: str) -> list[str]:
    from xrt.cli.prompt_args import strings_help
    from xrt.config.compose import config_names, group_options, unbuilt_options

    lines = [
        "",
        "options:",
        *(MULTIRUN if command in SWEEPS else []),
        f"  --config-name NAME   primary config in conf/ ({', '.join(config_names())}); bench uses `bench`",
        *VERBOSITY,
        *(JSON if command in (None, "config") else []),
        "  -h, --help           this help" + ("" if command is None else
                                              " (python -m xrt --help: every command, field and variable)"),
        "",
        OVERRIDES,
    ]
    if command in (None, "run", "config"):
        lines += strings_help()
    else:
        lines += ["string fields (paths, names, URLs) take the text as typed (python -m xrt --help: the rule)"]
    unbuilt = unbuilt_options()
    lines += ["", "groups:"] + [
        f"  {g:<10} {', '.join(o + (' (not built yet)' if (g, o) in unbuilt else '') for o in opts)}"
        for g, opts in group_options().items()
    ]
    return lines


def full_help() -> str:
    from xrt.cli.config_cmd import fields

    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<8} {text}" for name, text in COMMANDS.items()]
    lines += _common(None)
    lines += ["", "fields:", fields(), "", "environment (read by xrt; every behaviour switch is a field above):"]
    lines += [f"  {name:<18} {text}" for name, text in ENVIRONMENT.items()]
    return "\n".join(lines)


def command_help(command: str) -> str:
    """`python -m xrt COMMAND --help`: the command's usage, options, groups, its own fields in full and the shared
    sections by name."""
    from xrt.cli.config_cmd import ACTIONS
    from xrt.config import XrtConfig
    from xrt.reflect.help import format_rows, help_rows

    lines = [f"usage: python -m xrt {USAGES[command]}", "", f"{command}: {COMMANDS[command]}"]
    if command == "config":
        lines += ["", "actions:"] + [f"  {a:<8} {t}" for a, t in ACTIONS.items()]
    lines += _common(command)
    own = _own(command)
    lines += ["", f"fields of {command} (and every command's {', '.join(COMMON)}):",
              format_rows([r for r in help_rows(XrtConfig) if own(r[0])])]
    # config reads any section; profile also the bench protocol it starts from (conf/bench.yaml).
    also = set(OWN_SECTIONS) if command == "config" else {"bench"} if command == "profile" else set()
    shared = {name: text for name, text in _sections().items() if name not in OWN_SECTIONS or name in also}
    lines += ["", "sections (their fields: python -m xrt --help, or python -m xrt config fields):"]
    lines += [f"  {name + '.*':<12} {text}" for name, text in shared.items()]
    return "\n".join(lines)


__all__ = ["COMMANDS", "ENVIRONMENT", "USAGE", "command_help", "full_help"]
