"""Session 33: the persistent MLP's variants (bench/results/cpu-issue26-s32/mlp_time.py's VARIANTS and PIPELINED)
compiled for sm_90a on a machine without a GPU (tests/sm90_support.py): registers, spill bytes and the `cp.async`
count in the PTX (whether Triton pipelined the K loops through shared memory), per shape.

  git apply bench/results/cpu-issue26-s32/persistent_mlp.patch
  python bench/results/cpu-issue26-s33/mlp_ptxas.py"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
import tempfile

import torch

sys.path.insert(0, "tests")
from sm90_support import launches, ptxas_report, spill_bytes  # noqa: E402

from xrt.kernels import mlp_persistent as mod  # noqa: E402

BF16 = torch.bfloat16
SHAPES = ((1024, 3072), (4096, 12288))


def timing_variants() -> tuple[dict, ...]:
    spec = importlib.util.spec_from_file_location("mlp_time", "bench/results/cpu-issue26-s32/mlp_time.py")
    assert spec is not None and spec.loader is not None
    mlp_time = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mlp_time)  # its main() runs only as a script: importing it launches nothing
    return mlp_time.VARIANTS + mlp_time.PIPELINED


def main() -> None:
    defaults = {n: getattr(mod, n) for n in ("BN_A", "BK_A", "BN_B", "BK_B", "NUM_WARPS", "PREFETCH", "STAGES")}
    for hidden, ff in SHAPES:
        for variant in timing_variants():
            for name, value in variant.items():
                setattr(mod, name, value)
            tmp = tempfile.mkdtemp()
            try:
                for launch in launches(lambda h=hidden, f=ff: mod.mlp_persistent(
                        torch.empty(1, h, dtype=BF16), torch.empty(1, h, dtype=BF16), torch.empty(h, dtype=BF16),
                        1e-6, torch.empty(2 * f, h, dtype=BF16), torch.empty(h, f, dtype=BF16))):
                    report = ptxas_report(launch, tmp)
                    with open(os.path.join(tmp, f"{launch.name}.ptx")) as f:
                        ptx = f.read()
                    regs = re.findall(r"Used (\d+) registers", report)[-1]
                    print(f"H={hidden} {variant or defaults}: {regs} registers, {spill_bytes(report)} B spilled, "
                          f"{len(re.findall(r'cp[.]async[.]c[ag]', ptx))} cp.async", flush=True)
            except Exception as e:  # a variant that does not tile the shape
                print(f"H={hidden} {variant}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
            for name, value in defaults.items():
                setattr(mod, name, value)


if __name__ == "__main__":
    main()
