"""Session 27, no GPU: the split-KV decode attention compiled for sm_90 on CPU (tests/sm90_support.py: Triton's code
generator and its bundled ptxas, nothing launched), as tests/kernels/test_kernels_sm90.py records its launches: ptxas's
registers and spills, and the PTX's global loads before and after `griddepcontrol.wait` (the PDL wait).
`python bench/results/cpu-issue26-s27/sm90_check.py` from the repository root, with and without a patch applied."""
import glob
import sys
import tempfile

sys.path[:0] = ["tests", "tests/kernels"]
import test_kernels_sm90 as t  # noqa: E402
from sm90_support import launches, ptxas_report  # noqa: E402

for model in ("0.6b", "8b"):
    for name in ("decode_attention", "decode_attention rope"):
        for launch in launches(t.calls(model)[name]):
            tmp = tempfile.mkdtemp()
            report = ptxas_report(launch, tmp)
            regs = [x.split(":")[-1].strip() for x in report.splitlines() if "registers" in x][-1]
            spills = [x.strip() for x in report.splitlines() if "spill" in x][-1]
            ptx = open(glob.glob(tmp + "/*.ptx")[0]).read().splitlines()
            wait = next(i for i, x in enumerate(ptx) if "griddepcontrol.wait" in x)
            before = sum("ld.global" in x for x in ptx[:wait])
            after = sum("ld.global" in x for x in ptx[wait:])
            print(f"{model} {name}: {regs}; {spills}; ld.global before the wait {before}, after {after}")
