"""The one error a refused request raises, in the Python API and (as an exit status 2 line) in the CLI."""

from __future__ import annotations


def one_line(text: str) -> str:
    """text with every unprintable character escaped: user input quoted in a message (a dict key holding
    a newline, a lone surrogate) can neither split the line nor fail to print."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class RequestError(ValueError):
    """A request the engine refuses before queuing anything: one line, `field: message`.

    field: what was wrong, as the caller named it (`prompts[2]`, `sampling.top_p`, `sampling[1].seed`);
    index: the prompt it concerns, when it concerns one (the CLI names the prompt's source line instead)."""

    def __init__(self, field: str, message: str, index: int | None = None) -> None:
        self.field = one_line(field)
        self.message = one_line(message)
        self.index = index
        super().__init__(f"{self.field}: {self.message}" if self.field else self.message)
