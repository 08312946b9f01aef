"""KV-cache tiers below the GPU pages (issue 13): chunk keys (`keys.py`), the chunk layout and checksum
(`chunk.py`), L1 host memory (`l1.py`, copies GPU pages <-> L1 in `copy.py`) and L2 storage through a NIXL
agent (`l2.py`, its on-disk index in `index.py`; in S3 objects `l2_objects.py`, their listing and deletes in
`obj_client.py`; the NIXL import in `nixl_api.py`).

A chunk is `cache.chunk_tokens` tokens of every layer's K and V, one contiguous block of bytes: the unit every
tier stores, keys and checksums. Nothing here imports the engine; the engine (or the KV manager) drives it."""
