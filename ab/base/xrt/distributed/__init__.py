"""Tensor parallelism across processes: one model over `parallel.tp` ranks on torch.distributed (NCCL on CUDA,
gloo on CPU). Rank 0 is the caller's process and runs the engine (scheduler, sampler, detokenizer) against a
`TPRunner` (`driver.py`), which implements the executor's `Runner` protocol: each step goes to the other
ranks over the step channel first (`channel.py`, `wire.py`), then through rank 0's own `ModelRunner`; the
collectives inside the model keep the ranks in step. The other ranks (`worker.py`) run the same steps on
their own `ModelRunner`. `launch.py` spawns them (or finds the ranks torchrun started), `groups.py` does the
rendezvous and makes the process groups, `watchdog.py` turns a dead or failing rank into one error on rank 0,
and `factory.py` builds the runner a config asks for (what the engine calls)."""
