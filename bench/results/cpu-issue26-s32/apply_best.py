"""Writes mlp_time.py's best.json (every tile constant, PREFETCH and STAGES) into xrt/kernels/mlp_persistent.py:
`python apply_best.py best.json xrt/kernels/mlp_persistent.py` (callC.sh, before its end-to-end A/B)."""

import json
import re
import sys

b, path = json.load(open(sys.argv[1])), sys.argv[2]
s = open(path).read()
s = re.sub(r"^BN_A, BK_A, BN_B, BK_B, NUM_WARPS = .*$", "BN_A, BK_A, BN_B, BK_B, NUM_WARPS = "
           + ", ".join(str(b[k]) for k in ("BN_A", "BK_A", "BN_B", "BK_B", "NUM_WARPS")), s, flags=re.M)
s = re.sub(r"^PREFETCH = .*$", f"PREFETCH = {b['PREFETCH']}", s, flags=re.M)
if "STAGES" in b:
    s = re.sub(r"^STAGES = .*$", f"STAGES = {b['STAGES']}", s, flags=re.M)
open(path, "w").write(s)
