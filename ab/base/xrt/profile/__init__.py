"""`python -m xrt profile`: where a step's time goes, by `profile.mode`:
- breakdown (CUDA): GPU time of one prefill and of back-to-back decode-graph replays, kernels summed per step;
- step: host vs device time of a prefill (prepare, plan, forward, logits) and of engine steps, top ops;
- host: the engine's host cost per decode step against a stand-in runner (no model; runs on CPU)."""
