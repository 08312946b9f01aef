"""What a checkpoint path names, below both xrt.config and xrt.models (it imports neither): `errors.py`
(`CheckpointError`, the error a checkpoint the user pointed at raises) and `hub.py` (a local directory, or a
Hugging Face Hub id in the local cache). Torch-free, so config composition resolves and checks `model.path`
without importing torch (`xrt config` stays fast)."""
