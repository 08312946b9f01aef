"""The paged KV cache: page pool, prefix cache and manager (manager.py), page tables, device tensors, sizing."""
