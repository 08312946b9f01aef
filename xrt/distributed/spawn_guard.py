"""The spawn start method runs the main script again in every worker it starts (to find the worker's function); a
script that builds a tensor-parallel `LLM` at its top level, outside `if __name__ == "__main__":`, would build it
again in the worker, which refuses to start processes while it is itself starting: 88 lines of tracebacks from
two processes. Found here first: rank 0 reads its own script's syntax tree before spawning anything, and a worker
that finds itself building an LLM while its process is still bootstrapping leaves with one line."""

from __future__ import annotations

import ast
import multiprocessing.process
import sys

GUARD = 'if __name__ == "__main__":'


def unguarded_line() -> tuple[str, int] | None:
    """(the main script, the top-level line now running) when that line is outside the `__main__` guard and spawn
    would run it again in each worker; None when it is guarded, or spawn re-runs nothing (`python -m pkg` runs a
    package's __main__.py, an interactive session or `-c` has no script)."""
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec_name = getattr(getattr(main, "__spec__", None), "name", None) or ""
    if not path or not path.endswith(".py") or spec_name == "__main__" or spec_name.endswith(".__main__"):
        return None
    frame = sys._getframe()
    while frame is not None and not (frame.f_code.co_filename == path and frame.f_code.co_name == "<module>"):
        frame = frame.f_back
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None
    guarded = any(_is_guard(node) and node.lineno <= line <= (node.end_lineno or node.lineno) for node in tree.body)
    return None if guarded else (path, line)


def _is_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.ops) != 1:
        return False
    sides = [node.test.left, *node.test.comparators]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return isinstance(node.test.ops[0], ast.Eq) and len(names) == 1 and len(mains) == 1


def bootstrapping() -> bool:
    """Whether this process is a spawned one still importing the parent's main script."""
    return bool(getattr(multiprocessing.process.current_process(), "_inheriting", False))


def check_spawn(tp: int) -> None:
    """Before rank 0 spawns its tp - 1 workers: ValueError naming the script's line when it lacks the guard; in a
    worker re-running an unguarded script, SystemExit with one line (its exit fails the run in rank 0)."""
    if bootstrapping():
        raise SystemExit(f"error: parallel.tp={tp}: this worker re-ran the main script, which builds the LLM "
                         f"outside `{GUARD}`; add that guard")
    found = unguarded_line()
    if found is not None:
        path, line = found
        raise ValueError(
            f"parallel.tp={tp}: xrt starts {tp - 1} worker process{'es' * (tp > 2)} with the spawn method, which runs "
            f"{path} again in each; put the code that builds the LLM ({path}:{line}) under `{GUARD}`"
        )


__all__ = ["GUARD", "bootstrapping", "check_spawn", "unguarded_line"]
