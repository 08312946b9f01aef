"""Bounds the schema's validators share."""

# Token counts, positions and page ids reach the attention metadata and page tables as int32.
INT32_MAX = 2**31 - 1

# Most top alternatives a request may ask logprobs for (vLLM's max_logprobs default, OpenAI's top_logprobs bound):
# each costs a row of the step's top-k on the device and a dict entry per token in every answer.
MAX_LOGPROBS = 20
