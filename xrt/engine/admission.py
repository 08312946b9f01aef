"""What a request is checked against before it is queued: its prompt (text tokenized, token ids in range) and its
length (model.max_model_len, the KV cache's capacity). The engine checks through it (`LLMEngine.check_request`); a
server whose engine runs in another process keeps a copy (it pickles, tokenizer and chat template with it), so a
bad request gets its 400 in the HTTP process, with the engine's words, without a round trip."""

from __future__ import annotations

from dataclasses import dataclass

from xrt.config import SamplingArgs, SchedulerArgs
from xrt.engine.errors import RequestError
from xrt.engine.request import Request
from xrt.engine.scheduler import admission_error
from xrt.engine.tokenizer import Tokenizer
from xrt.engine.validate_prompts import check_prompt, no_tokenizer


@dataclass(frozen=True)
class Admission:
    tokenizer: Tokenizer | None
    checkpoint_dir: str | None  # where a missing tokenizer.json would be, for the words of its error
    vocab_size: int
    max_model_len: int
    scheduler: SchedulerArgs
    num_pages: int
    page_size: int

    def check(self, prompt: object, sampling: SamplingArgs, *, add_special_tokens: bool = True,
              where: str = "prompt", index: int | None = None, ints: bool = False) -> Request:
        """Tokenizes and checks one prompt (sampling already validated); RequestError naming `where` for text that is
        not valid Unicode, token ids that are not ints in [0, vocab_size), an empty prompt, or one that can never
        run: no room under model.max_model_len, more than the KV cache holds. ints: token ids known to be plain
        ints (check_prompt)."""
        checked = check_prompt(prompt, where, self.vocab_size, index, ints)
        text: str | None = None
        if isinstance(checked, str):
            if self.tokenizer is None:
                raise RequestError(where, no_tokenizer(self.checkpoint_dir), index)
            text = checked
            ids = self.tokenizer.encode(checked, add_special_tokens=add_special_tokens)
        else:
            ids = checked
        error = admission_error(len(ids), self.max_model_len, self.scheduler, self.num_pages, self.page_size)
        if error is not None:
            raise RequestError(where, error, index)
        return Request(ids, sampling, text)
