"""Bounds the schema's validators share."""

# Token counts, positions and page ids reach the attention metadata and page tables as int32.
INT32_MAX = 2**31 - 1
